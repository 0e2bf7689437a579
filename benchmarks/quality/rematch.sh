#!/usr/bin/env bash
# Rematch, scored: fairseq's Multi30k row against this project's runs (several seeds of several
# recipes), on test_2016_flickr and, out of domain, on IWSLT TED's test set (tst2014), each table by paired
# bootstrap with fairseq's output as the baseline (python -m mt.compare: sacreBLEU's paired_bs, 1,000 resamples).
#
#   SEEDS="1 2 3" bash benchmarks/quality/recipe_trials.sh base big_d3      # 1. the runs (OUT/NAME.sSEED)
#   bash benchmarks/peers/fairseq/run.sh                            # 2. fairseq's row, the same host and day
#   bash benchmarks/quality/rematch.sh base big_d3                          # 3. this: the two tables
#
# Where a session is too short for all the runs on one host (7 runs of ~57 minutes), pair them instead: each
# session runs one fairseq seed and the same seed of each recipe, one after the other, and scores that pair:
#
#   SEED=2 WORK=/tmp/mt-peers/fairseq.s2 bash benchmarks/peers/fairseq/run.sh
#   SEEDS=2 bash benchmarks/quality/recipe_trials.sh base
#   SEEDS=2 FAIRSEQ=/tmp/mt-peers/fairseq.s2 bash benchmarks/quality/rematch.sh base
#
# and, once every pair is there, all of them with each seed against fairseq's run of the same seed ({seed} in
# FAIRSEQ marks the pairing) and the means over the pairs:
#
#   SEEDS="1 2 3" FAIRSEQ='/tmp/mt-peers/fairseq.s{seed}' bash benchmarks/quality/rematch.sh base
#
# Runs are read from OUT (default runs/trials: every NAME.sSEED of SEEDS), fairseq's outputs from FAIRSEQ
# (default /tmp/mt-peers/fairseq: hyp.test and hyp.iwslt_test). Each run translates the IWSLT test set once
# (OUT/NAME.sSEED/iwslt_test.hyp, with the run's own model and decode settings). Tables go to stdout and to
# OUT/rematch.{test,iwslt}.{md,json}, or with pairs to OUT/rematch.sSEED.{test,iwslt}.{md,json}.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
DATA=${DATA:-$ROOT/../shared/data}
OUT=${OUT:-runs/trials}
FAIRSEQ=${FAIRSEQ:-/tmp/mt-peers/fairseq}
SEEDS=${SEEDS:-1 2 3}
IWSLT=$DATA/iwslt_ted_de_en

[ $# -gt 0 ] || { echo "usage: bash $0 NAME... (runs OUT/NAME.sSEED of recipe_trials.sh)" >&2; exit 2; }
if [[ $FAIRSEQ == *"{seed}"* ]]; then groups=$SEEDS; else groups=all; fi  # one table per pair, or one for all
for group in $groups; do  # every input is checked before anything is translated or scored
    for f in "${FAIRSEQ//\{seed\}/$group}/hyp.test" "${FAIRSEQ//\{seed\}/$group}/hyp.iwslt_test"; do
        [ -f "$f" ] || { echo "error: $f not found: run bash benchmarks/peers/fairseq/run.sh first" >&2; exit 2; }
    done
done
for t in "$@"; do
    for seed in $SEEDS; do
        [ -f "$OUT/$t.s$seed/test_2016_flickr.hyp" ] || {
            echo "error: $OUT/$t.s$seed has no test_2016_flickr.hyp: train it first (SEEDS=\"$seed\" bash" \
                "benchmarks/quality/recipe_trials.sh $t)" >&2; exit 2; }
    done
done

tables=()
for group in $groups; do
    if [ "$group" = all ]; then seeds=$SEEDS stem=$OUT/rematch; else seeds=$group stem=$OUT/rematch.s$group; fi
    fairseq=${FAIRSEQ//\{seed\}/$group}
    test_hyps=("$fairseq/hyp.test") iwslt_hyps=("$fairseq/hyp.iwslt_test") names=(fairseq)
    for t in "$@"; do
        for seed in $seeds; do
            run=$OUT/$t.s$seed
            [ -f "$run/iwslt_test.hyp" ] || python translate.py checkpoint="$run" input="$IWSLT/test.en.gz" \
                output="$run/iwslt_test.hyp" device=cpu > /dev/null 2> "$run/iwslt_test.translate.log"
            test_hyps+=("$run/test_2016_flickr.hyp") iwslt_hyps+=("$run/iwslt_test.hyp") names+=("$t.s$seed")
        done
    done
    names=$(IFS=,; echo "${names[*]}")
    echo "## test_2016_flickr (Multi30k), against fairseq ($fairseq)"
    python -m mt.compare "${test_hyps[@]}" --refs "$DATA/multi30k/test_2016_flickr.de.gz" --names "$names" \
        --json "$stem.test.json" | tee "$stem.test.md"
    echo
    echo "## IWSLT TED tst2014 (out of domain), against fairseq ($fairseq)"
    python -m mt.compare "${iwslt_hyps[@]}" --refs "$IWSLT/test.de.gz" --names "$names" \
        --json "$stem.iwslt.json" | tee "$stem.iwslt.md"
    echo
    tables+=("$stem.test.json" "$stem.iwslt.json")
done

# Per test set and recipe: the means over its seeds of each metric (its own and fairseq's; with pairs, each seed's
# own fairseq run) and of the difference, with every seed's p-value (the goal: +1.5 lowercased BLEU on
# test_2016_flickr, p < 0.05).
python - "${tables[@]}" <<'PY'
import json, sys
from collections import defaultdict

by_set = defaultdict(lambda: defaultdict(list))  # test set -> recipe -> [(fairseq's metrics, the run's metrics)]
for path in sys.argv[1:]:
    fairseq, *runs = json.load(open(path))["systems"]
    for run in runs:
        by_set[path.rsplit(".", 2)[-2]][run["name"].rsplit(".s", 1)[0]].append((fairseq["metrics"], run["metrics"]))
for test_set, recipes in by_set.items():
    print(f"\n{test_set}: means over the seeds (fairseq's mean -> the recipe's), the mean difference (each seed's p)")
    for recipe, pairs in recipes.items():
        cells = []
        for metric in ("BLEU lc", "BLEU", "chrF"):
            base = sum(f[metric]["score"] for f, _ in pairs) / len(pairs)
            mine = sum(r[metric]["score"] for _, r in pairs) / len(pairs)
            delta = sum(r[metric]["delta"] for _, r in pairs) / len(pairs)
            ps = ", ".join(f"{r[metric]['p_bs']:.3f}" for _, r in pairs)
            cells.append(f"{metric} {base:.2f} -> {mine:.2f}, {delta:+.2f} (p {ps})")
        print(f"- {recipe} ({len(pairs)} seeds): " + "; ".join(cells))
PY
