# What the emulated multi-rank trainer suites share (test_emu_tp.sh, test_emu_pp.sh): source it
# after setting T (the suite's scratch directory) and WHAT (what needs MPI, for the message).
#   EMU                         where the MPI trainers are (build/emu, or $EMU_BIN_DIR: gpu_check.sh
#                               points it at the trainers built for the GPU)
#   pass NAME / fail NAME DETAIL...   one PASS or FAIL line; fail sets status=1
#   MPIRUN                      mpirun as root, oversubscribed, shared memory, a 300 s limit
#   D                           the flags of a fresh arithmetic dataset in $T/data
# Makes $T afresh; exits with one FAIL line when mpirun or an MPI build of the trainers is missing.
EMU=${EMU_BIN_DIR:-build/emu}
rm -rf "$T"
mkdir -p "$T"
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1"; shift; for line in "$@"; do echo "     $line"; done; status=1; }
status=0

if ! command -v mpirun >/dev/null; then
    echo "FAIL $WHAT needs mpirun and MPI (apt-get install libopenmpi-dev openmpi-bin, then make emu)"
    exit 1
fi
for b in $EMU/train_gpt2cu $EMU/train_gpt2cu_fp32; do
    if [ ! -x "$b" ] || ! strings "$b" | grep -q MPI_Init_thread; then
        echo "FAIL $b missing or built without MPI (make $EMU/train_gpt2cu $EMU/train_gpt2cu_fp32)"
        exit 1
    fi
done
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN="timeout 300 mpirun --oversubscribe --mca btl self,vader --mca mpi_yield_when_idle 1"

python3 dev/data/arithmetic.py --out-dir "$T/data" --num-train 3000 --num-val 300 >/dev/null || { echo "FAIL data generation"; exit 1; }
D="--train-data $T/data/train_*.bin --val-data $T/data/val_*.bin --tokenizer $T/data/tokenizer.bin"
