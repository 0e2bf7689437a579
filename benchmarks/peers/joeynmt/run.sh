#!/usr/bin/env bash
# JoeyNMT 2.3.0 on Multi30k En->De in this project's budget (issue 34): 56 minutes of wall-clock from the start of
# preprocessing to the last training update, two threads, then beam 5 on test_2016_flickr, scored by this project.
#
#   bash benchmarks/peers/joeynmt/run.sh          # from the repo root, with the project installed (for scoring)
#   WORK=/tmp/joey BUDGET_MIN=5 bash benchmarks/peers/joeynmt/run.sh    # a short smoke run
#
# Preprocessing as the recipe's scripts/get_iwslt14_bpe.sh: Moses tokenization, lowercasing, joint BPE learned
# with subword-nmt on the training text (here with sacremoses, the same call JoeyNMT makes at training time).
# JoeyNMT has no wall-clock limit: training is interrupted at the deadline (benchmarks/peers/budget.py), which it
# handles by saving its weights; it tests its best checkpoint by val BLEU (greedy), as it does by default.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/../common.sh"
VENV=$HERE/.venv
WORK=${WORK:-/tmp/mt-peers/joeynmt}

# importlib-metadata: joeynmt 2.3.0 imports it (joeynmt/helpers.py) without declaring it
peer_venv "$VENV" joeynmt==2.3.0 importlib-metadata
PY=$VENV/bin/python
rm -rf "$WORK" && mkdir -p "$WORK/data"

START=$(date +%s)
multi30k_text "$WORK/data"
for lang in en de; do
    moses_lowercase "$PY" "$lang" < "$WORK/data/train.$lang" > "$WORK/data/train.tok.$lang"
done
cat "$WORK/data/train.tok.en" "$WORK/data/train.tok.de" \
    | "$PY" -m subword_nmt.learn_bpe -s 10000 > "$WORK/data/bpe.codes"
sed "s|@WORK@|$WORK|g" "$HERE/config.yaml" > "$WORK/config.yaml"
echo "preprocessing: $(( $(date +%s) - START )) s; training until $(seconds_left "$START") s from now"

"$PYTHON" "$PEERS/budget.py" --deadline $(( START + BUDGET_MIN * 60 )) -- \
    "$PY" -m joeynmt train "$WORK/config.yaml" --skip-test > "$WORK/train.out" 2>&1
"$PY" -m joeynmt test "$WORK/config.yaml" --output-path "$WORK/hyp" > "$WORK/test.out" 2>&1

# The table's fields, read from JoeyNMT's own log (model/train.log, model/test.log).
LOG=$WORK/model/train.log
params=$(grep -oP "Total params: \K[0-9]+" "$LOG")
updates=$(grep -oP "Step: +\K[0-9]+" "$LOG" | tail -1)
epochs=$(grep -oP "Epoch +\K[0-9]+(?=, total training loss)" "$LOG" | tail -1 || true)
tok_s=$(grep -oP "Tokens per Sec: +\K[0-9]+" "$LOG" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
gen_s=$(grep -oP "Generation took +\K[0-9.]+" "$WORK/model/test.log" | tail -1)
sent_s=$("$PYTHON" -c "print(round(1000 / $gen_s, 1))")
"$PYTHON" "$PEERS/score.py" --hyp "$WORK/hyp.test" --out "$WORK" --toolkit joeynmt --version 2.3.0 \
    --meta params="$params" epochs="${epochs:-0}+ (${updates} updates)" train_tok_s="$tok_s" sent_s="$sent_s" \
        budget_min="$BUDGET_MIN" best_checkpoint="$(readlink "$WORK/model/best.ckpt" || echo none)"
