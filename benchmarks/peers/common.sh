# Shared by benchmarks/peers/<peer>/run.sh (sourced, not run). Every peer gets: its own virtual environment with
# the CPU torch wheel installed first, the Multi30k files as plain text, two threads, a wall-clock budget counted
# from the start of its preprocessing, and this project's scoring of its detokenized test output.

PEERS=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$PEERS/../.." && pwd)
MULTI30K=${MULTI30K:-$(cd "$ROOT/../shared/data/multi30k" 2>/dev/null && pwd || true)}
BUDGET_MIN=${BUDGET_MIN:-56}      # this project's recipe: 56 minutes including data preparation
PYTHON=${PYTHON:-python}          # the project's Python (scoring); the peer runs in its own venv
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} MKL_NUM_THREADS=${MKL_NUM_THREADS:-2}

die() { echo "error: $*" >&2; exit 2; }

[ -n "$MULTI30K" ] && [ -f "$MULTI30K/train.en.gz" ] || die "Multi30k not found: set MULTI30K=/path/to/multi30k"

# peer_venv DIR PACKAGE...: a venv with torch==2.13.0 first (a bare torch requirement would pull the CUDA wheels).
peer_venv() {
    local venv=$1; shift
    if [ ! -x "$venv/bin/python" ]; then
        python -m venv "$venv" || die "could not create a virtual environment in $venv"
    fi
    "$venv/bin/pip" install --quiet torch==2.13.0 || die "pip could not install torch==2.13.0 into $venv"
    "$venv/bin/pip" install --quiet "$@" || die "pip could not install $* into $venv"
}

# multi30k_text OUT: {train,val,test_2016_flickr}.{en,de} as plain UTF-8 text in OUT.
multi30k_text() {
    local out=$1 split lang
    mkdir -p "$out"
    for split in train val test_2016_flickr; do
        for lang in en de; do
            gzip -dc "$MULTI30K/$split.$lang.gz" > "$out/$split.$lang"
        done
    done
}

# seconds_left START: seconds of the budget left, counted from START (unix time).
seconds_left() { echo $(( $1 + BUDGET_MIN * 60 - $(date +%s) )); }

# moses_lowercase PY LANG < IN > OUT: Moses-tokenize (sacremoses, in the peer's venv PY) and lowercase, one line per
# line, as the peers' IWSLT preparation scripts do.
moses_lowercase() {
    "$1" -c 'import sys
from sacremoses import MosesTokenizer
tok = MosesTokenizer(lang=sys.argv[1])
for line in sys.stdin:
    print(tok.tokenize(line.strip(), return_str=True).lower())' "$2"
}
