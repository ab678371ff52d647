# tables/claims and the adaptive design that decides how many seeds each claim gets
# (grids/claims/claims.yaml `design`, mor.claims.seeding), as Snakemake checkpoints.
#
#   round 0    the grids' own seeds: results/claims/round0/<grid>.parquet for every grid a
#              claim reads, then the checkpoint `seeding` -> results/claims/round0/plan.json:
#              the verdicts so far and, for each undecided claim whose next pre-registered
#              look fits the CPU budget, the seeds its deciding blocks (`decided_by`) reach next.
#   round r    the same grids with those blocks' seeds raised (mor.grids.load_grid(seeds=...));
#              only the new seeds train, since a run's id is its config's hash.
#   stop       at the first round whose plan adds nothing (every claim decided, past its last
#              look, or over budget); tables/claims is drawn from that round's results, with
#              a note on every round.
# The looks are pre-registered and Holm runs over the mode's pre-registered family (design.family),
# so which claims the data send seeds to (cheapest expected decision first) does not inflate the error rate (mor.claims.seeding's docstring,
# tests/unit/test_stats.py). Tables and figures draw the grids' own seeds (results/<grid>.parquet).
#
# The rounds depend not on claims.yaml's mtime but on what they plan with (mor.claims.plan_inputs:
# the mode's design, budget, family and the claims' numbers), as a digest in `params:` (the
# params trigger, as a job's settings in common.smk): an edit the planning does not read (a
# `reanalyses` record, a comment, a source, the other mode's budget) replans nothing and redraws
# tables/claims alone, which reads claims.yaml itself; an edit it reads replans every round.
from mor.claims.plan_inputs import plan_digest

PLAN_DIGEST = checked(plan_digest, CLAIMS_SPEC, MODE)


rule collect_round:
    localrule: True
    input:
        round_run_results,
    output:
        "results/claims/round{round}/{grid}.parquet",
    log:
        "logs/claims/round{round}/collect-{grid}.log",
    shell:
        "{PY} collect --grid {wildcards.grid} --out {output:q} {input:q} > {log:q} 2>&1"


checkpoint seeding:
    localrule: True
    input:
        this_round_inputs,
    output:
        "results/claims/round{round}/plan.json",
    params:
        mode=MODE,
        previous=previous_plan_arg,
        planned=PLAN_DIGEST,  # the looks, spending, budget and margins it plans with: an edit of them replans every round
    log:
        "logs/claims/round{round}/seeding.log",
    shell:
        # the file it plans from goes in at parse time (f-string): where the checkout lies is no rerun trigger
        "{PY}.claims.rounds --results results/claims/round{wildcards.round} --analyses results --grids {GRIDS_DIR:q}"
        f" --mode {{params.mode}} {{params.previous}} --spec {shlex.quote(str(CLAIMS_SPEC))} --out {{output:q}} > {{log:q}} 2>&1"


rule claims:
    localrule: True
    input:
        final_round_inputs,
        design=str(CLAIMS_SPEC),  # the whole file: the table draws its sources and re-analyses
    output:
        report(directory("tables/claims"), patterns=["{file}.html", "{file}.png"], caption=CAPTION,
               category=section("tables/claims"), subcategory="tables/claims"),
    params:
        mode=MODE,
        rounds=round_plan_args,
        final=final_round_param,
    log:
        "logs/report/claims.log",
    shell:
        "{PY} claims --results results/claims/round{params.final} --analyses results {params.rounds}"
        " --spec {input.design:q} --out {output:q} --mode {params.mode} > {log:q} 2>&1"
