"""The one exception type that means "the user asked for something we cannot do", and
how any exception is said in one line."""


class MgbenchError(Exception):
    """Bad input or an impossible request.

    The CLI prints the message as one line and exits with status 2, without a
    traceback (``--debug`` shows it). The message must name what is wrong and how to
    fix it.
    """


def first_line(text: str) -> str:
    """The first non-blank line of an error message, stripped ("" when there is none):
    one line for a record or a reason, even where torch's internal asserts start their
    message with a newline."""
    return next((line.strip() for line in text.splitlines() if line.strip()), "")
