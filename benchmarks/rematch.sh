#!/usr/bin/env bash
# Issue 47's rematch, scored: fairseq's Multi30k row against this project's runs (several seeds of several
# recipes), on test_2016_flickr and, out of domain, on IWSLT TED's test set (tst2014), each table by paired
# bootstrap with fairseq's output as the baseline (python -m mt.compare: sacreBLEU's paired_bs, 1,000 resamples).
#
#   SEEDS="1 2 3" bash benchmarks/recipe_trials.sh base big_d3      # 1. the runs (OUT/NAME.sSEED)
#   bash benchmarks/peers/fairseq/run.sh                            # 2. fairseq's row, the same host and day
#   bash benchmarks/rematch.sh base big_d3                          # 3. this: the two tables
#
# Where a session is too short for all the runs on one host (7 runs of ~57 minutes), pair them instead: each
# session runs one fairseq seed and the same seed of each recipe, one after the other, and scores that pair:
#
#   SEED=2 WORK=/tmp/mt-peers/fairseq.s2 bash benchmarks/peers/fairseq/run.sh
#   SEEDS=2 bash benchmarks/recipe_trials.sh base
#   SEEDS=2 FAIRSEQ=/tmp/mt-peers/fairseq.s2 bash benchmarks/rematch.sh base
#
# Runs are read from OUT (default /work/runs/trials: every NAME.sSEED of SEEDS), fairseq's outputs from FAIRSEQ
# (default /tmp/mt-peers/fairseq: hyp.test and hyp.iwslt_test). Each run translates the IWSLT test set once
# (OUT/NAME.sSEED/iwslt_test.hyp, with the run's own model and decode settings). Tables go to stdout and to
# OUT/rematch.{test,iwslt}.{md,json}.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
DATA=${DATA:-$ROOT/../shared/data}
OUT=${OUT:-/work/runs/trials}
FAIRSEQ=${FAIRSEQ:-/tmp/mt-peers/fairseq}
SEEDS=${SEEDS:-1 2 3}
IWSLT=$DATA/iwslt_ted_de_en

[ $# -gt 0 ] || { echo "usage: bash $0 NAME... (runs OUT/NAME.sSEED of recipe_trials.sh)" >&2; exit 2; }
for f in "$FAIRSEQ/hyp.test" "$FAIRSEQ/hyp.iwslt_test"; do
    [ -f "$f" ] || { echo "error: $f not found: run bash benchmarks/peers/fairseq/run.sh first" >&2; exit 2; }
done
test_hyps=("$FAIRSEQ/hyp.test") iwslt_hyps=("$FAIRSEQ/hyp.iwslt_test") names=(fairseq)
for t in "$@"; do
    for seed in $SEEDS; do
        run=$OUT/$t.s$seed
        [ -f "$run/test_2016_flickr.hyp" ] || {
            echo "error: $run has no test_2016_flickr.hyp: train it first (SEEDS=\"$SEEDS\" bash" \
                "benchmarks/recipe_trials.sh $t)" >&2; exit 2; }
        [ -f "$run/iwslt_test.hyp" ] || python translate.py checkpoint="$run" input="$IWSLT/test.en.gz" \
            output="$run/iwslt_test.hyp" device=cpu > /dev/null 2> "$run/iwslt_test.translate.log"
        test_hyps+=("$run/test_2016_flickr.hyp") iwslt_hyps+=("$run/iwslt_test.hyp") names+=("$t.s$seed")
    done
done
names=$(IFS=,; echo "${names[*]}")
echo "## test_2016_flickr (Multi30k), against fairseq"
python -m mt.compare "${test_hyps[@]}" --refs "$DATA/multi30k/test_2016_flickr.de.gz" --names "$names" \
    --json "$OUT/rematch.test.json" | tee "$OUT/rematch.test.md"
echo
echo "## IWSLT TED tst2014 (out of domain), against fairseq"
python -m mt.compare "${iwslt_hyps[@]}" --refs "$IWSLT/test.de.gz" --names "$names" \
    --json "$OUT/rematch.iwslt.json" | tee "$OUT/rematch.iwslt.md"

# Per recipe: the mean over its seeds of each metric's difference to fairseq, and every seed's p-value (issue 47's
# goal: +1.5 lowercased BLEU on test_2016_flickr, p < 0.05).
python - "$OUT/rematch.test.json" "$OUT/rematch.iwslt.json" <<'PY'
import json, sys
from collections import defaultdict

for path in sys.argv[1:]:
    systems = json.load(open(path))["systems"][1:]
    by_recipe = defaultdict(list)
    for s in systems:
        by_recipe[s["name"].rsplit(".s", 1)[0]].append(s["metrics"])
    print(f"\n{path}: mean difference to fairseq over the seeds (each seed's p)")
    for recipe, runs in by_recipe.items():
        cells = []
        for metric in ("BLEU lc", "BLEU", "chrF"):
            mean = sum(r[metric]["delta"] for r in runs) / len(runs)
            ps = ", ".join(f"{r[metric]['p_bs']:.3f}" for r in runs)
            cells.append(f"{metric} {mean:+.2f} (p {ps})")
        print(f"- {recipe} ({len(runs)} seeds): " + "; ".join(cells))
PY
