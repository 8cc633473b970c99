"""`semgov bench` outputs: the Markdown report and the PNG plots, from ``results.json`` data."""

from __future__ import annotations

from pathlib import Path
from typing import Any

Json = dict[str, Any]
ARMS = ("exact_only", "similarity_only", "governed")


def _f(x: Any, spec: str = ".2f") -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return format(x, spec)
    return str(x)


def _ms(x: float | None, spec: str = ".1f") -> str:
    return "-" if x is None else format(1e3 * x, spec)


def _rate(x: Json, key: str, n: int) -> str:
    """``k/n [lo-hi%]``: a count and its 95% Wilson interval."""
    lo, hi = x[f"{key}_ci95"]
    return f"{x[key]}/{n} [{100 * lo:.0f}-{100 * hi:.0f}%]"


def _cohorts(results: Json) -> list[str]:
    present = results["arms"]["governed"]["cohorts"]
    return [c for c in results["config"]["cohorts"] if c in present]


def plots(results: Json, out: Path) -> list[str]:
    """``ttft_by_cohort.png`` and ``quality_by_arm.png`` in ``out``; returns the file names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = results["arms"]
    cohorts = _cohorts(results)
    env = results["environment"]

    fig, ax = plt.subplots(figsize=(max(8.0, 0.9 * len(cohorts) + 2), 5.0))
    width = 0.27
    for i, arm in enumerate(ARMS):
        ys = [arms[arm]["cohorts"][c]["median_ttft_ratio"] or 0.0 for c in cohorts]
        ax.bar([j + (i - 1) * width for j in range(len(cohorts))], ys, width, label=arm)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_yscale("log")
    ax.set_ylim(top=ax.get_ylim()[1] * 1.8)
    ax.set_xticks(range(len(cohorts)))
    labels = [
        f"{c}\n({arms['governed']['cohorts'][c]['expect']}, n={arms['governed']['cohorts'][c]['n']})"
        for c in cohorts
    ]
    ax.set_xticklabels(labels, rotation=45, ha="right", fontsize=8)
    ax.set_ylabel("median TTFT cold / warm (log scale)")
    ax.legend(ncols=3, loc="upper center")
    ax.set_title(
        f"TTFT speed-up by cohort and arm: {env['model_short']}, ~{results['config']['tokens']} tokens"
    )
    fig.tight_layout()
    fig.savefig(out / "ttft_by_cohort.png", dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    xs = list(range(len(ARMS)))
    bars = (
        ("quality regressions", "quality_regressions", -0.2),
        ("unsafe materializations", "unsafe_materializations", 0.2),
    )
    for label, key, dx in bars:
        ys = [arms[a][key] for a in ARMS]
        rects = ax.bar([x + dx for x in xs], ys, 0.4, label=label)
        ax.bar_label(rects, fontsize=8)
    ax.set_xticks(xs)
    ax.set_xticklabels([f"{a}\n(n={arms[a]['pairs']} pairs)" for a in ARMS])
    ax.set_ylabel("pairs")
    ax.set_title("Quality regressions and unsafe reuse by arm")
    ax.set_ylim(top=max(1.0, ax.get_ylim()[1] * 1.25))
    ax.legend(ncols=2, loc="upper center")
    fig.tight_layout()
    fig.savefig(out / "quality_by_arm.png", dpi=110)
    plt.close(fig)
    return ["ttft_by_cohort.png", "quality_by_arm.png"]


def _arm_table(results: Json) -> list[str]:
    arms = results["arms"]
    out = [
        "| arm | pairs | unsafe materializations | quality regressions | changed answers [95%] "
        "| changed required values [95%] | known value lost [95%] | greedy = cold "
        "| materialized tokens (pairs) | prefill tokens avoided | median TTFT cold/warm, all "
        "| median TTFT cold/warm, allow-expected |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for a in ARMS:
        s, n = arms[a], arms[a]["pairs"]
        out.append(
            f"| {a} | {s['pairs']} | {s['unsafe_materializations']} | {s['quality_regressions']} "
            f"| {_rate(s, 'changed_answers', n)} | {_rate(s, 'changed_required_values', n)} "
            f"| {_rate(s, 'values_lost', n)} | {s['greedy_agree']}/{n} "
            f"| {s['materialized_tokens']} ({s['materialized_pairs']}) | {s['prefill_tokens_avoided']} "
            f"| {_f(s['median_ttft_ratio'])}x (n={s['pairs']}) "
            f"| {_f(s['median_ttft_ratio_allow_expected'])}x (n={s['allow_expected_pairs']}) |"
        )
    return out


def _cohort_table(results: Json) -> list[str]:
    arms = results["arms"]
    out = [
        "| cohort | expect | n | governed decisions | cold TTFT ms | TTFT ratio exact / similarity / "
        "governed "
        "| materialized tokens (pairs) exact / similarity / governed | regressions exact / similarity / "
        "governed "
        "| known value stated: cold; warm exact / similarity / governed |",
        "|---|---|---:|---|---:|---|---|---|---|",
    ]
    for c in _cohorts(results):
        e, s, g = (arms[a]["cohorts"][c] for a in ARMS)
        xs = (e, s, g)
        dec = ", ".join(f"{k} {v}" for k, v in g["actions"].items())
        ratio = " / ".join(f"{_f(x['median_ttft_ratio'])}x" for x in xs)
        mat = " / ".join(f"{x['materialized_tokens']} ({x['materialized_pairs']})" for x in xs)
        reg = " / ".join(str(x["quality_regressions"]) for x in xs)
        val = f"{g['values_present_cold']}/{g['n']}; " + " / ".join(str(x["values_present_warm"]) for x in xs)
        out.append(
            f"| {c} | {g['expect']} | {g['n']} | {dec} | {g['median_ttft_cold_ms']:.0f} | {ratio} "
            f"| {mat} | {reg} | {val} |"
        )
    return out


def _quality_table(results: Json) -> list[str]:
    arms = results["arms"]
    out = [
        "| cohort | n | exact_only | similarity_only | governed |",
        "|---|---:|---|---|---|",
    ]
    for c in _cohorts(results):
        cells = []
        for a in ARMS:
            x = arms[a]["cohorts"][c]
            cells.append(
                f"{x['greedy_agree']} / {x['top1_agree']} / {x['median_kl']:.1e} / {x['max_kl']:.1e}"
            )
        out.append(f"| {c} | {arms['governed']['cohorts'][c]['n']} | " + " | ".join(cells) + " |")
    return out


def _regression_table(results: Json) -> list[str]:
    arms = results["arms"]
    out = [
        "| cohort | n | cold states the known value | " + " | ".join(ARMS) + " |",
        "|---|---:|---:|---|---|---|",
    ]
    for c in _cohorts(results):
        cells = []
        for a in ARMS:
            x = arms[a]["cohorts"][c]
            lo, hi = x.get("quality_regression_ci95", (0.0, 1.0))
            cells.append(f"{x['quality_regressions']} [{100 * lo:.0f}-{100 * hi:.0f}%]")
        g = arms["governed"]["cohorts"][c]
        out.append(f"| {c} | {g['n']} | {g['values_present_cold']} | " + " | ".join(cells) + " |")
    return out


def _contract_table(results: Json) -> list[str]:
    arms = results["arms"]
    out = [
        "| cohort | n | " + " | ".join(ARMS) + " |",
        "|---|---:|---|---|---|",
    ]
    for c in _cohorts(results):
        n = arms["governed"]["cohorts"][c]["n"]
        cells = [
            f"{_rate(x, 'changed_answers', n)}; {_rate(x, 'changed_required_values', n)}"
            for x in (arms[a]["cohorts"][c] for a in ARMS)
        ]
        out.append(f"| {c} | {n} | " + " | ".join(cells) + " |")
    return out


def _pairs_table(results: Json) -> list[str]:
    out = [
        "| pair | expect | tokens | lcp | arm | action | materialized | computed | TTFT cold ms "
        "| TTFT warm ms | ratio | greedy = cold | known value cold -> warm | required values (contract) "
        "| regression |",
        "|---|---|---:|---:|---|---|---:|---:|---:|---:|---:|---|---|---|---|",
    ]
    for r in results["pairs"]:
        cv = "yes" if all(r["cold"]["values_present"].values()) else "no"
        for a in ARMS:
            x = r["arms"][a]
            wv = "yes" if all(x["values_present"].values()) else "no"
            agree = "yes" if x["greedy_agree"] else f"no (@{x['first_divergence']})"
            kept = "changed" if x["contract"]["values_changed"] else "kept"
            out.append(
                f"| {r['pair']} | {r['expect']} | {r['recipient_tokens']} | {r['common_prefix']} | {a} "
                f"| {x['action']} | {x['materialized_tokens']} | {x['computed_tokens']} "
                f"| {_ms(r['cold']['ttft_s'])} | {_ms(x['ttft_s'])} | {_f(x['ttft_ratio'])} | {agree} "
                f"| {cv} -> {wv} | {kept} | {'REGRESSION' if x['quality_regression'] else ''} |"
            )
    return out


def _answers(results: Json) -> list[str]:
    out = []
    for r in results["pairs"]:
        out.append(f"- `{r['pair']}` ({', '.join(r['required'])}): {r['question']}")
        out.append(f"  - cold: {r['cold']['answer']!r}")
        for a in ARMS:
            x = r["arms"][a]
            if not x["greedy_agree"]:
                out.append(f"  - {a}: {x['answer']!r} ({x['contract']['detail']})")
    return out


def _header(results: Json) -> list[str]:
    env, cfg, contracts = results["environment"], results["config"], results["contracts"]
    mode = "--quick" if cfg["quick"] else "full"
    return [
        "# semgov bench report",
        "",
        f"- Model: {env['model']} (source sha256 `{env['source_sha256']}`), loaded in "
        f"{env['model_load_s']:.1f} s",
        f"- torch {env['torch']}, transformers {env['transformers']}, Python {env['python']}, "
        f"{env['threads']} threads pinned, {env['cpus']} CPUs, {env['platform']}",
        f"- Run: {mode}, started {results['started_at']}, {results['wall_s']:.0f} s wall in all",
        f"- Workload: {len(_cohorts(results))} cohorts x {cfg['pairs_per_cohort']} pairs = "
        f"{results['arms']['governed']['pairs']} pairs; recipient prompts {env['prompt_tokens_min']}-"
        f"{env['prompt_tokens_max']} tokens (target {cfg['tokens']}); greedy answers of at most "
        f"{cfg['max_new_tokens']} tokens; {cfg['repeats']} timed prefill(s) per arm and pair (the fastest "
        "counts)",
        f"- Response contracts: `{contracts['source']}` (sha256 `{contracts['sha256']}`): "
        + "; ".join(contracts["entries"]),
    ]


def _tables(results: Json) -> list[str]:
    return [
        "## Per arm",
        "",
        *_arm_table(results),
        "",
        "## Per cohort, arms side by side",
        "",
        "Median TTFT ratio cold/warm per arm (higher is faster; the governed arm's warm TTFT includes its "
        "decision, signing and audit hand-off); KV materialized according to the engine's realization "
        "events; "
        "quality regressions; pairs whose answer states the known value, cold and per arm.",
        "",
        *_cohort_table(results),
        "",
        "Quality detail: greedy answers identical to cold / first-token top-1 identical / median and max "
        "KL(cold || warm) of the first token in nats, each of n pairs.",
        "",
        *_quality_table(results),
        "",
        "Changed answers; changed required values, per cohort and arm, each with its 95% Wilson interval, "
        "as each pair's response contract compares them (the contracts file above; a changed answer "
        "differs from cold's at all, token for token).",
        "",
        *_contract_table(results),
        "",
        "Quality regressions per cohort and arm with their 95% Wilson interval (0 of n still allows a "
        "rate up to the interval's top), and how many cold answers state the known value at all "
        "(the model's limit: a lost known value is only counted where cold stated it).",
        "",
        *_regression_table(results),
    ]


def _prefix_section(pm: Json) -> list[str]:
    return [
        f"## Prefix reuse of a {pm['prompt_tokens']}-token prompt",
        "",
        "The donor asked another question about the same evidence. Warm reuses the "
        f"{pm['common_prefix']}-token "
        f"common prefix: {pm['materialized_tokens']} tokens materialized (the engine copies whole "
        f"{pm.get('chunk_tokens', '?')}-token chunks and computes the rest), {pm['computed_tokens_warm']} "
        "computed. "
        f"Fastest of {pm['runs']} runs each: cold {_ms(pm['cold_ttft_s'])} ms, warm {_ms(pm['warm_ttft_s'])} "
        "ms: "
        f"**{_f(pm['ratio'], '.1f')}x** (target >= 5x: {'met' if pm['meets_target'] else 'NOT met'}). "
        f"First-token KL {pm['kl']:.1e}, max |logit difference| {pm['logits_max_abs_diff']:.1e}, "
        f"greedy answers identical: {'yes' if pm['greedy_agree'] else 'no'}.",
    ]


def _overhead_section(results: Json) -> list[str]:
    ov, reg, po = results["governance_overhead"], results["donor_registration"], results["pair_overhead"]
    return [
        "## Governance overhead",
        "",
        f"Decision (facts and ten gates), Ed25519 signing and audit-log hand-off, timed together for the "
        f"{ov['prompt_tokens']}-token prefix case ({ov['decision']}), n={ov['samples']}:",
        "",
        f"- steady state (later decisions on the same donor, as when one donor serves many requests): median "
        f"{_ms(ov['steady_median_s'], '.3f')} ms, p90 {_ms(ov['steady_p90_s'], '.3f')} ms = "
        f"**{ov['steady_pct_of_cold_ttft']:.3f}% of the cold TTFT** ({_ms(ov['cold_ttft_s'], '.0f')} ms; "
        f"target < 1%: {'met' if ov['meets_target'] else 'NOT met'})",
        "- first decision on the donor (its provenance verified for the first time): "
        f"{_ms(ov['first_s'], '.3f')} ms = "
        f"{ov['first_pct_of_cold_ttft']:.3f}% of the cold TTFT",
        "- off the recipient's path: donor registration (the Presidio scan of the donor text, once per "
        f"donor, when it becomes a donor): median {_f(reg['median_ms'], '.1f')} ms, "
        f"max {_f(reg['max_ms'], '.1f')} ms (n={reg['n']})",
        f"- in the pairs above (each donor new, registered first), the governed decision: median "
        f"{_f(po['median_ms'], '.2f')} ms, {_f(po['median_pct_of_cold_ttft'], '.2f')}% of the pair's cold "
        "TTFT "
        f"(max {_f(po['max_pct_of_cold_ttft'], '.2f')}%, n={po['n']})",
    ]


def _noise_section(nf: Json) -> list[str]:
    return [
        "## Noise floor: cold vs cold in the same run",
        "",
        f"n={nf['n']} pairs prefilled cold twice: greedy answers identical {nf['greedy_agree']}/{nf['n']}, "
        "max KL "
        f"{_f(nf['max_kl'], '.1e')}, max |logit difference| {_f(nf['max_logits_abs_diff'], '.1e')}, earliest "
        f"divergence {_f(nf['min_first_divergence'])}. "
        + (
            "Cold prefill is deterministic here, so any greedy divergence of a warm answer counts as a "
            "regression."
            if nf["min_first_divergence"] is None
            else "A warm answer regresses when it diverges before that position."
        ),
    ]


def _method_section(results: Json) -> list[str]:
    return [
        "## What was measured, and how",
        "",
        "- Pairs follow the example generator's design (tenants, tasks, response contracts, cohorts, "
        "single-gate mutations) in SmolLM2's chat template, tokenized with the model's tokenizer one role "
        "segment "
        "(system, instruction, evidence, question) at a time; segment tokens equal the whole prompt's "
        "tokenization: "
        f"{'yes' if results['tokenization_consistent'] else 'NO'}. The evidence embeds the value each "
        "question "
        "asks for. Expected decisions follow from the cohort design; each donor carries provenance signed "
        "with a "
        "throwaway Ed25519 key the bench's keyring trusts (the unknown-key cohort signs with another).",
        "- Arms: `exact_only` materializes the common prefix (one prefix span from position 0) whoever the "
        "donor is; `similarity_only` materializes every span token verification found (prefix or shifted, "
        "any "
        "segment role) whenever the candidate's similarity clears the policy minimum "
        f"({results['policy']['similarity_min']}); `governed` runs `Evaluator.evaluate`, appends the signed "
        "record to an audit log and hands the record to the engine's fail-closed `governed_prefill`.",
        "- TTFT = the engine's prefill time to the first token's logits (`Prefill.seconds`), threads pinned, "
        "fastest of the timed runs (other load on a shared machine only ever adds time). The donor's KV is "
        "computed beforehand (the cache's content, not the recipient's cost), and so is semgov's donor "
        "registration (its PII scan). The governed arm adds its first decision on the donor (facts, "
        "gates, signing, audit hand-off). "
        "similarity_only's span search is not timed.",
        "- Reuse counts only from the engine's realization events (`materialized_tokens`: KV copied). Unsafe "
        "materialization: a deny-expected pair for which an arm materialized any KV. exact_only's copies are "
        "exact prefix KV (what cold computes): unsafe as a tenant, namespace or provenance boundary "
        "crossing, "
        "not numerically.",
        "- Quality: greedy decoding (stops at `<|im_end|>`), cold vs warm; first divergence; KL(cold || "
        "warm) of "
        "the first token's distribution; the answers compared as the request's response contract says "
        "(`semgov.contracts`: a changed answer differs from cold's at all; a changed required value is a "
        "figure the contract's patterns match in one answer and not the other); the known value (the "
        "workload's ground truth, the figure the question asks for) is stated when its number is among "
        "the answer's numbers. Quality regression: the warm answer loses a known value the cold answer "
        "stated, or diverges from cold earlier than the cold/cold floor allows.",
    ]


def report(results: Json) -> str:
    """The Markdown report: every figure with its n, then how it was measured."""
    sections = [
        _header(results),
        _tables(results),
        _prefix_section(results["prefix_measurement"]),
        _overhead_section(results),
        _noise_section(results["noise_floor"]),
        _method_section(results),
        ["## Pairs", "", *_pairs_table(results)],
        ["Answers (cold, and every warm answer that differs from it):", "", *_answers(results)],
        [
            "Plots: `ttft_by_cohort.png` (median TTFT ratio by cohort and arm), `quality_by_arm.png` "
            "(quality regressions and unsafe materializations by arm). Raw rows: `results.json` (and "
            "`pairs.jsonl`, written as each pair completes).",
        ],
    ]
    # every section ends with an empty line, and so does the report
    return "\n".join(line for section in sections for line in (*section, ""))
