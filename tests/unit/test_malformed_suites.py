"""Property: every malformed suite is one line on stderr, exit status 2, no traceback."""

import json
import string

from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mgbench.cli import main
from mgbench.config import SWEEP_KEYS

scalars = st.one_of(st.integers(-10**6, 10**6), st.floats(allow_nan=False, allow_infinity=False), st.booleans(),
                    st.text(max_size=12))
values = st.one_of(scalars, st.lists(scalars, max_size=4))


def toml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, str):
        return json.dumps(v)
    return repr(v)


def suite_text(sweep: dict) -> str:
    return 'name = "prop"\n[sweep]\n' + "".join(f"{json.dumps(k)} = {toml_value(v)}\n" for k, v in sweep.items())


def is_rejected_by_schema(key: str, value) -> bool:
    check = SWEEP_KEYS[key][0]
    vals = value if isinstance(value, list) else [value]
    return not vals or any(check(v) for v in vals)


unknown_keys = st.text(alphabet=string.ascii_letters + "_-", min_size=1, max_size=15).filter(lambda k: k not in SWEEP_KEYS)
bad_known = st.tuples(st.sampled_from(sorted(SWEEP_KEYS)), values).filter(lambda kv: is_rejected_by_schema(*kv))

malformed = st.one_of(
    st.text(max_size=200).map(lambda t: t + "\n[sweep\n"),               # broken TOML
    st.dictionaries(unknown_keys, values, min_size=1, max_size=3).map(suite_text),  # unknown keys
    bad_known.map(lambda kv: suite_text({kv[0]: kv[1]})),                # wrong types / values
    st.text(alphabet=string.printable, max_size=120).map(lambda t: 'name = "x"\n' + t),  # anything at all...
)


def assert_clean_rejection(tmp_path, text):
    path = tmp_path / "s.toml"
    path.write_text(text)
    result = CliRunner().invoke(main, ["run", str(path), "--dry-run", "--results-dir", str(tmp_path / "r")])
    if result.exit_code == 0:
        return  # the last generator can produce a valid suite; nothing to check
    assert result.exit_code == 2, (text, result.output, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mgbench: error: "), (text, result.stderr)
    assert "Traceback" not in result.output
    assert not (tmp_path / "r").exists()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=malformed)
def test_every_malformed_suite_is_one_clean_line(tmp_path, text):
    assert_clean_rejection(tmp_path, text)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.one_of(st.dictionaries(unknown_keys, values, min_size=1, max_size=3).map(suite_text),
                      bad_known.map(lambda kv: suite_text({kv[0]: kv[1]}))))
def test_schema_violations_always_exit_2(tmp_path, text):
    path = tmp_path / "s.toml"
    path.write_text(text)
    result = CliRunner().invoke(main, ["run", str(path), "--dry-run"])
    assert result.exit_code == 2, (text, result.output, result.exception)
