"""The one exception type that means "the user asked for something we cannot do"."""


class MgbenchError(Exception):
    """Bad input or an impossible request.

    The CLI prints the message as one line and exits with status 2, without a
    traceback (``--debug`` shows it). The message must name what is wrong and how to
    fix it.
    """
