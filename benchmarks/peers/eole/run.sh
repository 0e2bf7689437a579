#!/usr/bin/env bash
# Eole on Multi30k En->De in this project's budget: 56 minutes of wall-clock from the start of
# preprocessing to the last training update, two threads, then beam 5 on test_2016_flickr, scored by this project.
#
#   bash benchmarks/peers/eole/run.sh          # from the repo root, with the project installed (for scoring)
#   WORK=/tmp/eole BUDGET_MIN=8 bash benchmarks/peers/eole/run.sh    # a short smoke run
#
# Preprocessing as the recipe's prepare_wmt_ende_data.sh --method sentencepiece (a unigram model on the source and
# target training text, character coverage 1.0), then `eole build_vocab`. Eole has no wall-clock limit, only
# train_steps: a timed run of 150 steps first (outside the budget: the clock stops for it) gives the seconds per
# step, its start-up and one validation, and the real run gets the steps that fit what is left of the budget.
# Eole validates for monitoring only (it keeps the last model), so the real run validates once, at its end.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/../common.sh"
VENV=$HERE/.venv
WORK=${WORK:-/tmp/mt-peers/eole}
CAL_STEPS=${CAL_STEPS:-150}   # ~8 minutes here; the steps after the first report (50) are timed
# The recipe trains in bf16: kept where the CPU computes bf16 natively, fp32 where it would be emulated.
if grep -qE '\b(amx_bf16|avx512_bf16)\b' /proc/cpuinfo; then DTYPE=${EOLE_DTYPE:-bf16}; else DTYPE=${EOLE_DTYPE:-fp32}; fi

# aiohttp: eole 0.6.4 imports it at start-up (eole/bin/tools/load_test.py) without declaring it
peer_venv "$VENV" eole==0.6.4 aiohttp
PY=$VENV/bin/python
EOLE=$VENV/bin/eole
rm -rf "$WORK" && mkdir -p "$WORK/data"

render() {  # render OUT TRAIN_STEPS VALID_STEPS WARMUP MODEL_DIR
    # the noam factor that gives the recipe's peak learning rate (2 / sqrt(1024 * 4000)) at hidden 256, warmup $4
    local lr
    lr=$("$PY" -c "import math; print(round(2 * math.sqrt(256 * $4 / (1024 * 4000)), 4))")
    sed -e "s|@WORK@|$WORK|g" -e "s|@TRAIN_STEPS@|$2|g" -e "s|@VALID_STEPS@|$3|g" -e "s|@WARMUP@|$4|g" \
        -e "s|@LR@|$lr|g" -e "s|@DTYPE@|$DTYPE|g" \
        -e "s|model_path: \"$WORK/model\"|model_path: \"$5\"|" "$HERE/config.yaml" > "$1"
}

START=$(date +%s)
multi30k_text "$WORK/data"
cat "$WORK/data/train.en" "$WORK/data/train.de" > "$WORK/data/train.all"
"$PY" -c "import sentencepiece as spm; spm.SentencePieceTrainer.train(input='$WORK/data/train.all', \
model_prefix='$WORK/spm', vocab_size=10000, character_coverage=1.0, model_type='unigram', minloglevel=2)"
render "$WORK/vocab.yaml" 1 1 1 "$WORK/model"
"$EOLE" build_vocab --config "$WORK/vocab.yaml" --n_sample -1 > "$WORK/vocab.out" 2>&1 \
    || die "eole failed: see the end of $WORK/vocab.out"
PREP_S=$(( $(date +%s) - START ))

# The timed run (its minutes are given back to the budget).
CAL0=$(date +%s)
render "$WORK/cal.yaml" $CAL_STEPS $CAL_STEPS $(( CAL_STEPS * 8 / 100 )) "$WORK/cal_model"
"$EOLE" train --config "$WORK/cal.yaml" > "$WORK/cal.out" 2>&1 \
    || die "eole failed: see the end of $WORK/cal.out"
CAL_S=$(( $(date +%s) - CAL0 ))
START=$(( START + CAL_S ))
read -r SEC_PER_STEP OVERHEAD_S <<< "$("$PY" - "$WORK/cal.out" "$CAL_S" $CAL_STEPS <<'EOF'
import re, sys
log, total, steps = open(sys.argv[1]).read(), float(sys.argv[2]), int(sys.argv[3])
secs = {int(s): float(t) for s, t in re.findall(r"Step (\d+)/ *\d+;.*?(\d+) sec;", log)}
first = min(secs)   # the first report (step 50): start-up and the first, slow steps are before it
per_step = (secs[steps] - secs[first]) / (steps - first)
print(f"{per_step:.4f} {total - steps * per_step:.0f}")   # start-up, saving and the validation
EOF
)"
TRAIN_STEPS=$("$PY" -c "print(max(1, int(($(seconds_left "$START") - $OVERHEAD_S) / $SEC_PER_STEP)))")
WARMUP=$(( TRAIN_STEPS * 8 / 100 ))
echo "preprocessing $PREP_S s; timed run $CAL_S s: $SEC_PER_STEP s/step, $OVERHEAD_S s outside steps;" \
    "training $TRAIN_STEPS steps, warmup $WARMUP, peak learning rate 9.9e-4, compute_dtype $DTYPE"

render "$WORK/train.yaml" "$TRAIN_STEPS" "$TRAIN_STEPS" "$WARMUP" "$WORK/model"
"$EOLE" train --config "$WORK/train.yaml" > "$WORK/train.out" 2>&1 \
    || die "eole failed: see the end of $WORK/train.out"
TRAIN_END=$(date +%s)   # Eole logs no time for its last update; its closing validation and save are counted in
echo "budget: $(( (TRAIN_END - START) / 60 )) min $(( (TRAIN_END - START) % 60 )) s from preprocessing to the end of training"

GEN0=$("$PY" -c "import time; print(time.time())")
"$EOLE" predict --model_path "$WORK/model" --src "$WORK/data/test_2016_flickr.en" --output "$WORK/hyp.test" \
    --beam_size 5 --batch_size 4096 --batch_type tokens > "$WORK/predict.out" 2>&1 \
    || die "eole failed: see the end of $WORK/predict.out"
sent_s=$("$PY" -c "import time; print(round(1000 / (time.time() - $GEN0), 1))")   # model loading included

params=$(grep -oP "number of parameters: \K[0-9]+" "$WORK/train.out" | head -1)
tok_s=$(grep -oP "[0-9]+/ *\K[0-9]+(?= tok/s)" "$WORK/train.out" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
epochs=$(grep -oP "Sentences processed: +\K[0-9]+" "$WORK/train.out" | tail -1 \
    | awk -v n="$(wc -l < "$WORK/data/train.en")" '{printf "%.1f", $1 / n}')   # sentences trained on / pairs
"$PYTHON" "$PEERS/score.py" --hyp "$WORK/hyp.test" --out "$WORK" --toolkit eole --version 0.6.4 \
    --meta params="${params:-?}" train_steps="$TRAIN_STEPS" epochs="$epochs" train_tok_s="$tok_s" sent_s="$sent_s" \
        budget_min="$BUDGET_MIN" train_minutes="$(( (TRAIN_END - START) / 60 ))" compute_dtype="$DTYPE"
