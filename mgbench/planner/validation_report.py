"""Prints the planner's validation: predictions against published training throughput
(published_runs.toml), the same-software A100 / H100 pairs (generation_pairs.toml), the
intervals' leave-one-out coverage, the solved defaults, and every accelerator family's
public training rows against the model and a one-constant baseline
(accelerator_runs.toml, accelerator_validation.py), and the published MoE runs
(published_moe_runs.toml, moe_validation.py).

    python -m mgbench.planner.validation_report
"""

from __future__ import annotations

from .. import catalog
from . import stack
from .uncertainty import coverage_statement, cross_generation_coverage, leave_one_out_coverage, moe_coverage_statement
from .validation import (PAIRS_STACK, error_table, pair_summary, pair_table, published_runs, solve_defaults,
                         solve_stack, stack_errors)


def main() -> None:
    from tabulate import tabulate

    rows, _ = error_table()
    published = {r["id"] for r in published_runs()}
    print(tabulate([[r["id"], r["stack"], r["unit"], r["published"], f"{r['predicted']:.1f}", f"{r['error_pct']:+.1f}%",
                     r["role"], r["source"]] for r in rows if r["id"] in published],
                   headers=["run", "stack", "metric", "published", "predicted", "error", "role", "source"]))
    for name, mae in stack_errors(rows).items():
        n = sum(r["role"] == "validation" and r["stack"] == name for r in rows)
        print(f"{name}: mean absolute error over {n} validation rows on the A100: {mae:.1f}% "
              f"(stack efficiency {stack.efficiency(name):.3f}, solved {solve_stack(name) if name != stack.DEFAULT_STACK else 1.0:.3f})")
    for r in rows:
        if r["why"]:
            print(f"{r['id']}: {r['role']}: {r['why']}")

    pairs = pair_table()
    src = catalog.load("generation_pairs.toml")["source"]
    print(f"\nA100 -> H100, same software ({src['software']}): {src['url']}, tables '{src['a100_table']}' and "
          f"'{src['h100_table']}'; tokens/s per GPU, stack {PAIRS_STACK}")
    print(tabulate([[p["id"], p["role"], p["a100"]["published"], f"{p['a100']['predicted']:.0f}", f"{p['a100']['error_pct']:+.1f}%",
                     p["h100"]["published"], f"{p['h100']['predicted']:.0f}", f"{p['h100']['error_pct']:+.1f}%",
                     f"{p['published_ratio']:.2f}", f"{p['predicted_ratio']:.2f}", f"{p['ratio_error_pct']:+.1f}%"]
                    for p in pairs],
                   headers=["pair", "role", "A100", "predicted", "error", "H100", "predicted", "error",
                            "H100/A100", "predicted", "error"]))
    for b in pair_summary(pairs):
        print(f"{b['band']:>10}: {b['pairs']:>2} pairs, ratio published {b['published_ratio_median']:.2f} / predicted "
              f"{b['predicted_ratio_median']:.2f} (medians), error mean |{b['ratio_mean_abs_error_pct']:.1f}|% "
              f"[{b['ratio_error_pct'][0]:+.1f}, {b['ratio_error_pct'][1]:+.1f}]; A100 absolute mean "
              f"|{b['a100_mean_abs_error_pct']:.1f}|% [{b['a100_error_pct'][0]:+.1f}, {b['a100_error_pct'][1]:+.1f}]; "
              f"H100 absolute mean |{b['h100_mean_abs_error_pct']:.1f}|% "
              f"[{b['h100_error_pct'][0]:+.1f}, {b['h100_error_pct'][1]:+.1f}]")

    cov = leave_one_out_coverage()
    print("\nintervals (uncertainty.py), leave-one-out per class: "
          + ", ".join(f"{k} {v['covered']} of {v['total']}" for k, v in cov["classes"].items()))
    cross = cross_generation_coverage()
    for name in ("rows", "ratio", "before", "after", "informational_before", "informational"):
        sel = cov["rows"] if name == "rows" else cross[name]
        out = [f"{r['id']} {r['error_pct']:+.1f}% not in [{r['interval_pct'][0]:+.1f}, {r['interval_pct'][1]:+.1f}]"
               for r in sel if not r["inside"]]
        print(f"  outside ({'validation rows' if name == 'rows' else name}): {', '.join(out) or 'none'}")
    print(coverage_statement())
    mm, c = solve_defaults()
    print(f"solved defaults: matmul_eff = {mm:.3f}, elementwise_passes = {c:.2f}")
    print_accelerator_tables()
    from .moe_pairs import pairs
    from .moe_pairs import report as pairs_report
    from .moe_validation import report as moe_report
    from .moe_validation import scored_rows as moe_scored

    scored = moe_scored()
    print()
    print(moe_report(scored))
    print(moe_coverage_statement())
    print()
    print(pairs_report(pairs(scored)))
    from .published_fits import ratios
    from .published_fits import report as fits_report

    print()
    print(fits_report(ratios(scored)))


def print_accelerator_tables() -> None:
    """Every accelerator_runs.toml row and the per-family table (accelerator_validation.py)."""
    from tabulate import tabulate

    from .accelerator_validation import TARGET_HELD_OUT_MEAN_PCT, TARGET_WORST_PCT, baseline_mfu, family_table, \
        scored_rows, targets
    from .moe_validation import conflict_line

    scored = scored_rows()
    base = baseline_mfu()
    print(f"\nAccelerator families (accelerator_runs.toml): model vs one-constant baseline (every GPU at "
          f"{100 * base['mfu']:.1f}% MFU, the median of published_runs.toml's {base['rows']} validation rows)")
    print(tabulate([[r["id"], r["family"], r["split"], r["metric"], f"{r['published']:.4g}", f"{r['predicted']:.4g}",
                     f"{r['error_pct']:+.1f}%", f"{r['baseline']:.4g}", f"{r['baseline_error_pct']:+.1f}%"]
                    for r in scored],
                   headers=["run", "family", "split", "metric", "published", "model", "error", "baseline", "error"]))
    for r in scored:
        if "other" in r:
            print(f"{r['id']}: {conflict_line(r)}")

    table = family_table(scored)
    print(tabulate([[t["family"], t["rows"], t["held_out"]["rows"], _pct(t["held_out"]["model"]["mean_abs_pct"]),
                     _pct(t["held_out"]["model"]["worst_abs_pct"]), _pct(t["held_out"]["baseline"]["mean_abs_pct"]),
                     t["fit"]["rows"], _pct(t["fit"]["model"]["mean_abs_pct"]), _pct(t["fit"]["model"]["worst_abs_pct"]),
                     _pct(t["fit"]["baseline"]["mean_abs_pct"]),
                     {True: "yes", False: "NO", None: "-"}[t["beats_baseline_held_out"]],
                     ", ".join(t["accelerators_without_rows"]) or "-"] for t in table],
                   headers=["family", "rows", "held out", "model mean", "model worst", "baseline mean", "fit",
                            "model mean", "model worst", "baseline mean", "beats baseline (held out)",
                            "no row of their own"]))
    t = targets(scored)
    print(f"targets: held-out mean |error| {t['held_out_mean_abs_pct']:.1f}% (target < {TARGET_HELD_OUT_MEAN_PCT:.0f}%: "
          f"{'met' if t['held_out_mean_met'] else 'NOT met'}); worst row {t['worst_row']} {t['worst_abs_pct']:.1f}% "
          f"(target <= {TARGET_WORST_PCT:.0f}%: {'met' if t['worst_met'] else 'NOT met'}); families without a row: "
          f"{', '.join(t['families_without_rows']) or 'none'}; families whose held-out rows the baseline predicts "
          f"better: {', '.join(t['families_losing_to_baseline']) or 'none'}")


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}%"


def family_name(family: str) -> str:
    """'nvidia-ampere' -> 'NVIDIA Ampere', 'amd-cdna3' -> 'AMD CDNA3'."""
    vendor, _, arch = family.partition("-")
    return f"{vendor.upper()} {arch.upper() if arch.startswith('cdna') else arch.capitalize()}"


def family_markdown() -> str:
    """The per-family validation table and its targets line, as markdown (README and
    docs/planner.md carry it as a generated part; tests/unit/test_docs.py keeps it equal)."""
    from .accelerator_validation import TARGET_HELD_OUT_MEAN_PCT, TARGET_WORST_PCT, family_table, scored_rows, targets
    from .moe_validation import conflict_line

    scored = scored_rows()
    rows = ["| family | rows | held out: mean / worst | one-constant baseline, held out | fit: mean / worst | "
            "beats the baseline (held out) |", "|---|---|---|---|---|---|"]
    for t in family_table(scored):
        ho, fit = t["held_out"], t["fit"]
        fit_txt = "-" if not fit["rows"] else f"{_pct(fit['model']['mean_abs_pct'])} / {_pct(fit['model']['worst_abs_pct'])}"
        measured = sorted({r["accelerator"] for r in scored if r["family"] == t["family"]})
        label = family_name(t["family"]) + (f" ({', '.join(measured)})" if measured else "")
        rows.append(f"| {label} | {t['rows']} | {_pct(ho['model']['mean_abs_pct'])} / "
                    f"{_pct(ho['model']['worst_abs_pct'])} | {_pct(ho['baseline']['mean_abs_pct'])} | {fit_txt} | "
                    f"{ {True: 'yes', False: '**no**', None: '-'}[t['beats_baseline_held_out']]} |")
    g = targets(scored)
    rows.append("")
    rows.append(f"Held-out mean |error| {g['held_out_mean_abs_pct']:.1f}% (target under {TARGET_HELD_OUT_MEAN_PCT:.0f}%: "
                f"{'met' if g['held_out_mean_met'] else 'not met'}); worst row `{g['worst_row']}` "
                f"{g['worst_abs_pct']:.1f}% (target {TARGET_WORST_PCT:.0f}%: {'met' if g['worst_met'] else 'not met'}); "
                f"families the baseline beats on their held-out rows: "
                f"{', '.join(family_name(f) for f in g['families_losing_to_baseline']) or 'none'}.")
    unscored = [r for r in scored if "other" in r]
    if unscored:
        rows.append("Not counted, as its source states its layout two ways: " + " ".join(
            f"`{r['id']}` ({conflict_line(r)})." for r in unscored))
    return "\n".join(rows)


def moe_markdown() -> str:
    """Every published MoE run predicted, and the per-split summary, as markdown."""
    from .moe_validation import TARGET_MEAN_PCT, TARGET_WORST_PCT, conflict_line, distinct_line, scored_rows, summary

    scored = scored_rows()
    rows = ["| run | split | published | predicted | error | MoE per-layer s a step (EFA proxy notify wait in it) |",
            "|---|---|---|---|---|---|"]
    for r in scored:
        if r["error_pct"] is None:
            rows.append(f"| `{r['id']}` | {r['split'].replace('_', ' ')} | {r['published']:.0f} | refused | - | - |")
            continue
        rows.append(f"| `{r['id']}` | {r['split'].replace('_', ' ')} | {r['published']:.0f} | {r['predicted']:.0f} | "
                    f"{r['error_pct']:+.1f}% | {r['terms']['moe_host_s'] + r['terms']['moe_efa_notify_s']:.2f} |")
    rows.append("")
    rows += [f"`{r['id']}`: {conflict_line(r)}.\n" for r in scored if "other" in r]
    parts = []
    summ = summary(scored)
    for split, s in summ.items():
        if s["predicted"]:
            parts.append(f"{split.replace('_', ' ')}: mean |error| {s['mean_abs_pct']:.1f}%, worst "
                         f"{s['worst_abs_pct']:.1f}% (`{s['worst_row']}`)")
    met = all(s["targets_met"] for s in summ.values())
    rows.append("; ".join(parts) + f"; {distinct_line(scored)}. Targets (mean under {TARGET_MEAN_PCT:g}%, none over "
                f"{TARGET_WORST_PCT:g}%, on both parts): {'met' if met else 'not met'}.")
    return "\n".join(rows)


if __name__ == "__main__":
    main()
