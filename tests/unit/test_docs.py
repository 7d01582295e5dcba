"""The documentation cannot drift from the tool (issue 28).

README.md and every page of docs/ (docs/research/ holds research notes, not pages) follow
one convention for examples, checked here:

- A command example is a fenced ```console block whose commands start with ``$ `` (a
  line ending in ``\\`` continues on the next); its other lines are output, not run.
  Command examples in ```bash / ```sh blocks are refused, so none escapes the test.
- Each example runs here, in the order of its page, in a temporary folder laid out like a
  checkout (:data:`CHECKOUT`: the suites, the committed reference run and hardware
  profile), with the venv's ``mgbench`` first on PATH, and must exit 0.
- A block that needs what CI has not is marked by an HTML comment on the line before it,
  ``<!-- needs: gpu -->``, ``<!-- needs: cluster -->`` or ``<!-- needs: network -->``
  (optionally ``<!-- needs: gpu: why -->``): it is not run, and the page says why.
- Other blocks say what they hold: ```toml (suite snippets, parsed and validated as
  suites), ```text (output, formats), ```json, ```python.
- Generated parts sit between ``<!-- generated: NAME -->`` and ``<!-- end generated -->``
  and equal what :data:`GENERATORS` makes of the code (the registries, the schema);
  ``python -m tests.unit.test_docs --write`` rewrites them.
- Every page of docs/ is linked from README.md, and no relative link of README.md or
  docs/*.md is broken (its file exists; its ``#anchor`` is a heading of the target, by
  GitHub's slug rule).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from mgbench.cli import main

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"


def pages() -> list[Path]:
    """README.md and docs/*.md (docs/research/ is not documentation: research notes)."""
    return [README, *sorted(DOCS.glob("*.md"))]


# What a block may need that CI does not have (the marker's word), and why it is not run.
NEEDS = {
    "gpu": "needs a CUDA device",
    "cluster": "needs several nodes or a Slurm cluster",
    "network": "downloads packages",
}
LANGUAGES = {"console", "toml", "text", "json", "python"}
FENCE = re.compile(r"^(\s*)(```+)\s*([^\s`]*)\s*$")
NEEDS_MARK = re.compile(r"^\s*<!--\s*needs:\s*([a-z]+)\s*(?::[^>]*)?-->\s*$")
EXAMPLE_TIMEOUT_S = 240


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    language: str
    lines: tuple[str, ...]  # the block's lines, the fence's indentation removed
    needs: str | None  # the marker's word on the line before, if any

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


@dataclass(frozen=True)
class Example:
    block: Block
    line: int
    command: str

    @property
    def where(self) -> str:
        return f"{self.block.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    out: list[Block] = []
    lines = page.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, ticks, language = m.group(1), m.group(2), m.group(3)
        prev = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        mark = NEEDS_MARK.match(prev)
        body: list[str] = []
        j = i + 1
        while j < len(lines) and lines[j].strip() != ticks:
            body.append(lines[j][len(indent):] if lines[j].startswith(indent) else lines[j].lstrip())
            j += 1
        assert j < len(lines), f"{page.relative_to(ROOT)}:{i + 1}: a code block is never closed"
        out.append(Block(page, i + 1, language, tuple(body), mark.group(1) if mark else None))
        i = j + 1
    return out


def examples(block: Block) -> list[Example]:
    """The commands of a console block: lines starting with '$ ', a trailing '\\' joining
    the next line."""
    out: list[Example] = []
    lines = block.lines
    i = 0
    while i < len(lines):
        if not lines[i].startswith("$ "):
            i += 1
            continue
        start, parts = i, [lines[i][2:]]
        while parts[-1].rstrip().endswith("\\") and i + 1 < len(lines):
            i += 1
            parts.append(lines[i])
        out.append(Example(block, block.line + 1 + start, "\n".join(parts)))
        i += 1
    return out


def all_blocks() -> list[Block]:
    return [b for p in pages() for b in blocks(p)]


# --- generated parts ----------------------------------------------------------------


def strategies_markdown() -> str:
    """The strategy table of docs/strategies.md, from mgbench/strategies REGISTRY."""
    from mgbench.strategies import REGISTRY

    rows = ["| strategy | layout degrees (default) | ZeRO stage | what it is |", "|---|---|---|---|"]
    for s in REGISTRY:
        if s.degrees is None:
            degrees = "dp = every rank"
        elif not s.degrees:
            degrees = "none (one process)"
        else:
            defaults = dict(s.defaults)
            named = [f"{d} = {defaults[d]}" if d in defaults else (f"{d} = the rest" if d == s.fills else d)
                     for d in s.degrees]
            degrees = ", ".join(named)
        zero = "-" if s.zero_stage is None else str(s.zero_stage)
        rows.append(f"| `{s.name}` | {degrees} | {zero} | {s.help.replace('|', chr(92) + '|')} |")
    return "\n".join(rows)


def schedules_markdown() -> str:
    """The pipeline schedule table of docs/strategies.md, from mgbench/strategies/schedules.py REGISTRY."""
    from mgbench.strategies.schedules import REGISTRY

    rows = ["| `pp_schedule` | torch class | chunks per rank | backward split | what it is |", "|---|---|---|---|---|"]
    for s in REGISTRY:
        chunks = "`virtual_stages`" if s.fixed_chunks is None else str(s.fixed_chunks)
        if s.placement == "v":
            chunks += " (in a V)"
        rows.append(f"| `{s.name}` | `{s.torch_class}` | {chunks} | {'yes' if s.split_backward else 'no'} | {s.help} |")
    return "\n".join(rows)


def suite_keys_markdown() -> str:
    """The suite key table of docs/suites.md, from the schema (python -m mgbench.config)."""
    from mgbench import config

    return config.keys_markdown()


def strategy_names_markdown() -> str:
    """README's one line of strategies and schedules, from both registries."""
    from mgbench.strategies import REGISTRY as STRATEGIES
    from mgbench.strategies.schedules import REGISTRY as SCHEDULES

    return (f"Strategies: {', '.join(f'`{s.name}`' for s in STRATEGIES)}; pipeline schedules: "
            f"{', '.join(f'`{s.name}`' for s in SCHEDULES)}.")


def accelerator_families_markdown() -> str:
    """The per-family validation table (README, docs/planner.md), from the validation files."""
    from mgbench.planner.validation_report import family_markdown

    return family_markdown()


def moe_runs_markdown() -> str:
    """Every published MoE run predicted and the summary line (docs/planner.md)."""
    from mgbench.planner.validation_report import moe_markdown

    return moe_markdown()


def moe_summary_markdown() -> str:
    """The MoE summary line alone, with the rows counted, the held-out figure by fabric and
    both splits by part of the file (README)."""
    from mgbench.planner import moe_validation as V

    rows = V.runs()
    scored = sum(r["split"] in V.SPLITS for r in rows)
    by_fabric = V.fabric_line(V.scored_rows())
    by_part = V.stack_line(V.scored_rows())
    return (f"{len(rows)} published rows, {scored} scored; " + moe_runs_markdown().splitlines()[-1]
            + " H" + by_fabric[1:] + ". B" + by_part[1:] + ".")


def moe_intervals_markdown() -> str:
    """The MoE intervals' half-widths and leave-one-out coverage (docs/planner.md)."""
    from mgbench.planner import uncertainty

    return uncertainty.moe_coverage_statement()


def moe_graphed_share_markdown() -> str:
    """The graphed rows against their two pricings, in one line (docs/planner.md)."""
    from mgbench.planner import moe_validation as V

    return V.graphed_share_report().splitlines()[-1]


def moe_pairs_markdown() -> str:
    """The published MoE A/B pairs against the model's (docs/planner.md)."""
    from mgbench.planner import moe_pairs

    return moe_pairs.markdown()


def moe_fits_markdown() -> str:
    """Published MoE layouts against the memory model, in one line (README, docs/planner.md)."""
    from mgbench.planner import published_fits as F

    return F.summary_line(F.summary(F.moe_ratios()), "Published MoE")


def fits_markdown() -> str:
    """Every published layout against the memory model, file by file (docs/planner.md)."""
    from mgbench.planner import published_fits as F

    s = F.summary()
    return "\n".join([*(f"- {F.summary_line(part, f'`{f}`:')}" for f, part in s["files"].items()),
                      f"- {F.summary_line(s, 'All published')}"])


def collectives_summary_markdown() -> str:
    """The multi-node all-reduce and all-to-all checks in one paragraph (README)."""
    from mgbench.planner import collective_validation as C

    scored = C.score()
    s = C.summary(scored, "all_reduce")
    held, fit = s["held_out"], s["fit"]
    a2a = C.summary(scored, "all_to_all")
    part = {k: f"mean |error| {v['mean_abs_pct']:.1f}%, worst {v['worst'][0]:.1f}% (`{v['worst'][1]}`)"
            for k, v in a2a.items() if v["rows"]}
    return (f"Collectives across nodes: published multi-node all-reduce bandwidth ({held['rows'] + fit['rows']} rows, "
            f"{fit['rows']} set the network links' rates; `python -m mgbench.planner.collective_validation`): held "
            f"out, mean |error| {held['mean_abs_pct']:.1f}%, worst {held['worst'][0]:.1f}% (`{held['worst'][1]}`). "
            f"All-to-all as MoE's dispatch prices it, against nccl-tests alltoall_perf "
            f"({a2a['held_out']['rows']} rows held out; {a2a['fit']['rows']} fit, which set NCCL's all-to-all share of "
            f"the links' rates and efa-v2's all-to-all cost per peer node, docs/planner.md): held out {part['held_out']}"
            + (f"; fit {part['fit']}." if "fit" in part else "."))


def ep_kernel_shares_markdown() -> str:
    """Each DeepEP-style backend's share of the network rate and its kernel rows' errors
    (docs/planner.md; planner/ep_kernels.py)."""
    from mgbench.planner import ep_kernels as K

    def part(s: dict) -> str:
        return f"{s['rows']} rows, {s['mean']:.1f}% (worst {s['worst']:.1f}%)" if s["rows"] else "-"

    lines = ["| backend | share of the network rate | fit | held out | held out, configurations no fit row holds |",
             "|---|---|---|---|---|"]
    for backend in sorted({r["backend"] for r in K.rows()}):
        s = K.summary(backend)
        lines.append(f"| {backend} | {K.backend_share(backend):.3f} | {part(s['fit'])} | {part(s['held_out'])} | "
                     f"{part(s['held_out_new'])} |")
    return "\n".join(lines) + "\n"


GENERATORS = {"strategies": strategies_markdown, "schedules": schedules_markdown, "suite-keys": suite_keys_markdown,
              "strategy-names": strategy_names_markdown, "accelerator-families": accelerator_families_markdown,
              "moe-runs": moe_runs_markdown, "moe-summary": moe_summary_markdown,
              "moe-intervals": moe_intervals_markdown, "moe-graphed-share": moe_graphed_share_markdown,
              "moe-pairs": moe_pairs_markdown, "moe-fits": moe_fits_markdown, "fits": fits_markdown,
              "collectives-summary": collectives_summary_markdown, "ep-kernel-shares": ep_kernel_shares_markdown}
GENERATED = re.compile(r"(<!-- generated: ([a-z-]+)[^\n]*-->\n)(.*?)(<!-- end generated -->)", re.S)


def generated_parts(text: str) -> list[tuple[str, str]]:
    """(name, body) of each generated part; the body without its last newline."""
    return [(m.group(2), m.group(3).removesuffix("\n")) for m in GENERATED.finditer(text)]


def regenerate(text: str) -> str:
    return GENERATED.sub(lambda m: m.group(1) + GENERATORS[m.group(2)]() + "\n" + m.group(4), text)


# --- links ----------------------------------------------------------------------------


LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")


def prose(page: Path) -> str:
    """A page without its code blocks and inline code (links there are not links)."""
    text, out, fence = page.read_text().splitlines(), [], None
    for line in text:
        m = FENCE.match(line)
        if m and (fence is None or line.strip() == fence):
            fence = m.group(2) if fence is None else None
            continue
        if fence is None:
            out.append(re.sub(r"`[^`]*`", "", line))
    return "\n".join(out)


def links(page: Path) -> list[str]:
    return [a or b for a, b in LINK.findall(prose(page))]


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, markup and punctuation dropped (letters,
    digits, '_', '-' and spaces kept), spaces to '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text
    text = text.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def headings(page: Path) -> list[str]:
    out, fence = [], None
    for line in page.read_text().splitlines():
        m = FENCE.match(line)
        if m and (fence is None or line.strip() == fence):
            fence = m.group(2) if fence is None else None
            continue
        if fence is None and (h := re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)):
            out.append(h.group(1))
    return out


def heading_anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for h in headings(page):
        s = slug(h)
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else f"{s}-{n}")
    return out


# --- the tests ------------------------------------------------------------------------


def test_every_docs_page_is_linked_from_the_readme():
    linked = {(README.parent / t.split("#")[0]).resolve() for t in links(README) if not re.match(r"\w+:", t)}
    unlinked = [p.relative_to(ROOT).as_posix() for p in pages()[1:] if p.resolve() not in linked]
    assert pages()[1:], "docs/ has no pages"
    assert not unlinked, f"README.md does not link {unlinked}: add them to its map of the documentation"


@pytest.mark.parametrize("page", pages(), ids=lambda p: p.name)
def test_relative_links_resolve(page):
    broken = []
    for target in links(page):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in heading_anchors(dest):
            broken.append(f"{target} (no heading '#{anchor}' in {dest.relative_to(ROOT)})")
    assert not broken, f"{page.relative_to(ROOT)}: broken links: {broken}"


def test_slugs_follow_github():
    assert slug("Mixture of experts and expert parallelism: `ep`") == "mixture-of-experts-and-expert-parallelism-ep"
    assert slug("HSDP, CPU offload, zero-bubble pipelines, FP8 (`suites/modern.toml`)") == (
        "hsdp-cpu-offload-zero-bubble-pipelines-fp8-suitesmoderntoml")
    assert slug("Memory, traced: `mgbench memory --trace`") == "memory-traced-mgbench-memory---trace"
    assert slug("A purchase decision, worked: rent or buy for Llama 3 8B on 1T tokens") == (
        "a-purchase-decision-worked-rent-or-buy-for-llama-3-8b-on-1t-tokens")


def test_blocks_follow_the_convention():
    problems = []
    for b in all_blocks():
        if b.language in ("bash", "sh", "shell", "zsh"):
            problems.append(f"{b.where}: a ```{b.language} block: write command examples as ```console with '$ '")
        elif b.language not in LANGUAGES:
            problems.append(f"{b.where}: a block must say what it holds (one of {sorted(LANGUAGES)}), "
                            f"not {b.language or 'nothing'!r}")
        if b.language == "console" and not examples(b):
            problems.append(f"{b.where}: a console block without a '$ ' command")
        if b.needs and b.needs not in NEEDS:
            problems.append(f"{b.where}: needs: {b.needs!r} is not one of {sorted(NEEDS)}")
        if b.needs and b.language != "console":
            problems.append(f"{b.where}: a needs: marker before a {b.language} block (it marks commands)")
    for p in pages():
        for line in prose(p).splitlines():
            if line.lstrip().startswith("<!--") and "needs" in line and not NEEDS_MARK.match(line):
                problems.append(f"{p.relative_to(ROOT)}: malformed marker {line.strip()!r}")
    assert not problems, "\n".join(problems)


def test_the_readme_shows_the_first_commands_and_the_setup():
    runnable = [e.command for b in blocks(README) if b.language == "console" and not b.needs for e in examples(b)]
    assert "mgbench run smoke" in runnable and "mgbench show" in runnable
    assert any(c.startswith("mgbench plan ") for c in runnable)
    text = README.read_text()
    # .ci/run greps README.md for the test command, exactly
    assert ("python3 -m venv .venv && .venv/bin/pip install torch==2.13.0 && .venv/bin/pip install -e '.[test]' "
            "&& .venv/bin/python -m pytest -q -rs -n 2 --dist loadfile") in text
    assert ("python3 -m venv .venv && .venv/bin/pip install torch==2.13.0 && .venv/bin/pip install -e . "
            "&& .venv/bin/mgbench run") in text
    assert len(text.splitlines()) < 200, "README.md is the one-screen entry: move detail to a docs/ page"


def test_generated_parts_equal_the_code():
    found = set()
    for p in pages():
        text = p.read_text()
        for name, body in generated_parts(text):
            assert name in GENERATORS, f"{p.relative_to(ROOT)}: unknown generated part {name!r}"
            found.add(name)
            assert body == GENERATORS[name](), (
                f"{p.relative_to(ROOT)}: generated part {name!r} drifted from the code: "
                "run `python -m tests.unit.test_docs --write`")
    assert found == set(GENERATORS), f"generated parts missing from the docs: {set(GENERATORS) - found}"


def test_toml_snippets_are_valid_suites():
    from mgbench.errors import MgbenchError
    from mgbench.suite import parse_suite

    problems = []
    for b in all_blocks():
        if b.language != "toml":
            continue
        text = "\n".join(b.lines)
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            problems.append(f"{b.where}: not TOML: {e}")
            continue
        if "sweep" not in data:
            continue
        try:  # hf: paths are relative to the suite's folder, and the docs' model files are examples
            parse_suite(text, str(ROOT / "docs" / "example.toml"), "cpu")
        except MgbenchError as e:
            problems.append(f"{b.where}: {e}")
    assert not problems, "\n".join(problems)


WORKED_PLAN = "mgbench plan --model llama3-8b --tokens 1e12 --systems dgx-h100,dgx-b200 --max-gpus 512"


def test_the_worked_purchase_decision_shows_current_output():
    """docs/planner.md's worked purchase decision quotes plan's output, wrapped and with
    parts elided ('...'): every quoted line is the command's output today (its figures
    went stale once, when a catalog figure changed)."""
    block = next(b for b in blocks(ROOT / "docs" / "planner.md")
                 if b.language == "console" and any(e.command == WORKED_PLAN for e in examples(b)))
    logical: list[str] = []
    for line in block.lines[1:]:
        if line.startswith("  - ") or not line[:1].isspace():
            logical.append(line.strip())
        else:  # a wrapped line continues the one before
            logical[-1] += " " + line.strip()
    res = CliRunner().invoke(main, WORKED_PLAN.split()[1:])
    assert res.exit_code == 0, res.output
    out = " ".join(res.output.split())
    stale = [frag for text in logical for frag in (f.strip() for f in text.split("...")) if frag and frag not in out]
    assert not stale, "docs/planner.md's worked plan no longer matches the output:\n" + "\n".join(stale)


def test_the_deepseek_v3_example_quotes_predicts_figures():
    """docs/planner.md quotes what predict says for DeepSeek-V3's published layout (tokens/s
    per GPU with rank 0 lightened and with the blocks split evenly, GB a GPU with and
    without the allowance): the figures it states are today's (they had drifted once,
    1,009 quoted where predict said 1,013)."""
    import json

    text = " ".join((ROOT / "docs" / "planner.md").read_text().split())
    args = ("predict --model deepseek-v3 --system hgx-h800 --num-gpus 2048 --pp 16 --ep 64 --schedule dualpipev "
            "--micro-batch 1 --global-batch 15360 --zero 1 --precision fp8 --fp8-recipe blockwise --state-bytes 2,4,8 "
            "--moe-dispatcher deepep --moe-node-limit 4 --moe-fp8-dispatch --moe-fp8-act-cache "
            "--moe-recompute-modules mla_up_proj,layernorm,moe_act --json").split()
    light = json.loads(CliRunner().invoke(main, args + ["--pp-last-layers", "1"]).output)
    even = json.loads(CliRunner().invoke(main, args).output)
    m = light["memory"]
    quoted = (f"The first predicts {light['tokens_per_s_per_gpu']:,.0f} tokens/s per GPU against the published 1,543",
              f"{even['tokens_per_s_per_gpu']:,.0f} with the blocks split evenly",
              f"Memory: {m['total_bytes'] / 1e9:.1f} GB a GPU with the allowance, "
              f"{(m['total_bytes'] - m['allowance_bytes']) / 1e9:.1f} GB counted")
    missing = [q for q in quoted if q not in text]
    assert not missing, f"docs/planner.md no longer quotes predict's figures: {missing}"


# What a checkout holds that the examples use: the suites, and the committed reference
# run and hardware profile (copies: an example may write into them).
CHECKOUT = ("suites", "results/profiles", "results/cpu-reference-2026-11-22")


def _checkout(where: Path) -> None:
    """A folder laid out as a user's checkout (CHECKOUT), with no other run in results/."""
    for name in CHECKOUT:
        shutil.copytree(ROOT / name, where / name)


# The pages whose examples run in another module instead, and which (a module of tests/unit
# or tests/integration): pytest-xdist's loadfile gives a module to one worker, and all
# pages' examples in one module (about 2 minutes) kept the README's test command past 6
# minutes (planner.md's, 39 s, moved on 2026-11-29 when the command reached 6:00). README's
# run in test_run_cpu, whose tests read the run its `mgbench run smoke` makes (one smoke run
# where there were two; 2026-11-29, twenty-fourth session, at 5:55).
SPLIT_PAGES = {"README.md": "test_run_cpu", "reports.md": "test_doc_examples",
               "planner.md": "test_doc_planner_examples"}


def split_examples_test(module: str):
    """The test that runs the examples of the SPLIT_PAGES given to ``module`` (its
    __name__), for that module to hold."""
    mine = [p for p in pages() if SPLIT_PAGES.get(p.name) == module.rsplit(".", 1)[-1]]

    @pytest.mark.parametrize("page", mine, ids=lambda p: p.name)
    def test_split_examples_run(page, tmp_path):
        run_examples(page, tmp_path)

    return test_split_examples_run


@pytest.mark.parametrize("page", [p for p in pages() if p.name not in SPLIT_PAGES], ids=lambda p: p.name)
def test_examples_run(page, tmp_path):
    run_examples(page, tmp_path)


def run_examples(page: Path, tmp_path: Path) -> list[tuple[str, subprocess.CompletedProcess]]:
    """Run every console example of ``page`` (those a marker does not exclude) in a fresh
    checkout under ``tmp_path``; each must exit 0. Returns each command with its process,
    for a module that reads what the examples made (test_run_cpu reads README's run)."""
    todo = [e for b in blocks(page) if b.language == "console" and not b.needs for e in examples(b)]
    for b in blocks(page):
        if b.language == "console" and b.needs:
            print(f"{b.where}: not run ({NEEDS[b.needs]}): {len(examples(b))} example(s)")
    if not todo:
        return []
    _checkout(tmp_path)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    times, done = [], []
    for e in todo:
        t0 = time.perf_counter()
        p = subprocess.run(["bash", "-o", "pipefail", "-c", e.command], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=EXAMPLE_TIMEOUT_S)
        times.append((time.perf_counter() - t0, e.command.split("\n")[0]))
        assert p.returncode == 0, (f"{e.where}: `{e.command}` exited {p.returncode}\n--- stdout\n{p.stdout[-3000:]}"
                                   f"\n--- stderr\n{p.stderr[-3000:]}")
        done.append((e.command, p))
    print("\n".join(f"{s:6.1f} s  {c}" for s, c in times))
    return done


if __name__ == "__main__":  # python -m tests.unit.test_docs [--write]
    if "--write" in sys.argv:
        for p in pages():
            old = p.read_text()
            new = regenerate(old)
            if new != old:
                p.write_text(new)
                print(f"rewrote {p.relative_to(ROOT)}")
    else:
        for name, make in GENERATORS.items():
            print(f"<!-- generated: {name} -->\n{make()}\n<!-- end generated -->\n")
