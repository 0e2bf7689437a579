#!/usr/bin/env bash
# JoeyNMT 2.3.0 on Multi30k En->De in this project's budget: 56 minutes of wall-clock from the start of
# preprocessing to the last training update, two threads, then beam 5 on test_2016_flickr, scored by this project.
#
#   bash benchmarks/peers/joeynmt/run.sh          # from the repo root, with the project installed (for scoring)
#   WORK=/tmp/joey BUDGET_MIN=5 bash benchmarks/peers/joeynmt/run.sh    # a short smoke run
#
# Preprocessing as the recipe's scripts/get_iwslt14_bpe.sh: Moses tokenization, lowercasing, joint BPE learned
# with subword-nmt on the training text (here with sacremoses, the same call JoeyNMT makes at training time).
# JoeyNMT has no wall-clock limit: training is interrupted at the deadline (benchmarks/peers/budget.py), which it
# handles by saving its weights; it tests its best checkpoint by val BLEU (greedy) if a validation
# fell within the budget, else the weights saved at the deadline, as it does by default.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/../common.sh"
VENV=$HERE/.venv
WORK=${WORK:-/tmp/mt-peers/joeynmt}

# importlib-metadata: joeynmt 2.3.0 imports it (joeynmt/helpers.py) without declaring it
peer_venv "$VENV" joeynmt==2.3.0 importlib-metadata
PY=$VENV/bin/python
# Two incompatibilities of joeynmt 2.3.0 with torch 2.13, neither changing what it computes: ReduceLROnPlateau no
# longer takes `verbose` (JoeyNMT passes False, the default), and torch.load's weights_only default (torch >= 2.6)
# refuses JoeyNMT's checkpoints, which hold more than tensors.
sed -i '/"verbose": False,/d' "$("$PY" -c 'import joeynmt.builders as b; print(b.__file__)')"
export TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1
rm -rf "$WORK" && mkdir -p "$WORK/data"

START=$(date +%s)
multi30k_text "$WORK/data"
for lang in en de; do
    moses_lowercase "$PY" "$lang" < "$WORK/data/train.$lang" > "$WORK/data/train.tok.$lang"
done
cat "$WORK/data/train.tok.en" "$WORK/data/train.tok.de" \
    | "$PY" -m subword_nmt.learn_bpe -s 10000 > "$WORK/data/bpe.codes"
# The joint vocabulary that tied embeddings need, made as JoeyNMT's scripts/build_vocab.py --joint makes it (BPE
# applied to both sides of the training text, JoeyNMT's own frequency sort); JoeyNMT alone builds one per language.
"$PY" - "$WORK/data" <<'EOF'
import sys
from collections import Counter
from pathlib import Path
from subword_nmt.apply_bpe import BPE
from joeynmt.helpers import write_list_to_file
from joeynmt.vocabulary import sort_and_cut
data = Path(sys.argv[1])
with open(data / "bpe.codes", encoding="utf-8") as codes:
    bpe = BPE(codes)
counts = Counter()
for lang in ("en", "de"):
    with open(data / f"train.tok.{lang}", encoding="utf-8") as lines:
        counts.update(tok for line in lines for tok in bpe.process_line(line).split())
write_list_to_file(data / "vocab.txt", sort_and_cut(counts, sys.maxsize, 1))
EOF
sed "s|@WORK@|$WORK|g" "$HERE/config.yaml" > "$WORK/config.yaml"
echo "preprocessing: $(( $(date +%s) - START )) s; training until $(seconds_left "$START") s from now"

"$PYTHON" "$PEERS/budget.py" --deadline $(( START + BUDGET_MIN * 60 )) -- \
    "$PY" -m joeynmt train "$WORK/config.yaml" --skip-test > "$WORK/train.out" 2>&1 \
    || die "JoeyNMT training failed: see the end of $WORK/train.out"
"$PY" -m joeynmt test "$WORK/config.yaml" --output-path "$WORK/hyp" > "$WORK/test.out" 2>&1 \
    || die "JoeyNMT testing failed: see the end of $WORK/test.out"

# The table's fields, read from JoeyNMT's own log (model/train.log, model/test.log).
LOG=$WORK/model/train.log
params=$(grep -oP "Total params: \K[0-9]+" "$LOG")
updates=$(grep -oP "Interrupt at epoch [0-9]+, step \K[0-9]+" "$LOG" | tail -1 || true)
epochs=$(grep -oP "Epoch +\K[0-9]+(?=, total training loss)" "$LOG" | tail -1 || true)
tok_s=$(grep -oP "Tokens per Sec: +\K[0-9]+" "$LOG" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}' || true)
gen_s=$(grep -oP "Generation took +\K[0-9.]+" "$WORK/model/test.log" | tail -1)
sent_s=$("$PYTHON" -c "print(round(1000 / $gen_s, 1))")
"$PYTHON" "$PEERS/score.py" --hyp "$WORK/hyp.test" --out "$WORK" --toolkit joeynmt --version 2.3.0 \
    --meta params="$params" epochs="${epochs:-0}+ (${updates} updates)" train_tok_s="$tok_s" sent_s="$sent_s" \
        budget_min="$BUDGET_MIN" best_checkpoint="$(readlink "$WORK/model/best.ckpt" || echo none)"
