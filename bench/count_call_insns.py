# Counts what one C API call executes on this rank: instructions, stores (instructions that
# write memory, by their operands) and locked instructions, per function (inlined ones by their
# own name), by single-stepping one call in gdb. For the cost of a small call's fixed path
# (issue 15): the hypervisor gives no store or instruction counters, and valgrind cannot run
# the library. Run one rank under gdb, e.g. the root of a 2-rank broadcast:
#
#   mpirun -np 2 --bind-to none sh -c 'if [ $OMPI_COMM_WORLD_RANK = 0 ]; then
#     exec gdb -q -batch -x bench/count_call_insns.py --args ferroccl-bench broadcast -b 8 -e 8 -n 6000 -w 10;
#     else exec ferroccl-bench broadcast -b 8 -e 8 -n 6000 -w 10; fi'
#
# COUNT_FUNCTION (default ncclBroadcast) names the call; COUNT_SKIP (default 3000) calls run
# first at full speed. Stepping 1000 instructions takes a few seconds; the other rank waits.
import os

import gdb

FUNCTION = os.environ.get("COUNT_FUNCTION", "ncclBroadcast")
SKIP = int(os.environ.get("COUNT_SKIP", "3000"))


def writes_memory(mnemonic, operands):
    if mnemonic.startswith(("push", "call")):
        return True
    if mnemonic.startswith(("cmp", "test", "prefetch", "bt", "j", "nop")):
        return False
    if "," in operands:
        return "(" in operands.split(",")[-1]  # AT&T: the destination is the last operand
    return "(" in operands and mnemonic.startswith(("inc", "dec", "neg", "not", "set"))


def function_at(pc):
    try:
        block = gdb.block_for_pc(pc)
        return block.function.name if block and block.function else "?"
    except RuntimeError:
        return "?"


gdb.execute("set pagination off")
gdb.execute("set confirm off")
gdb.execute(f"break {FUNCTION}")
gdb.execute("run")
gdb.execute(f"ignore 1 {SKIP}")
gdb.execute("continue")
arch = gdb.selected_inferior().architecture()
caller_sp = int(gdb.parse_and_eval("$sp")) + 8  # above the return address: the caller's frame
total = stores = locked = 0
per_function = {}
while total < 200000:
    pc = int(gdb.parse_and_eval("$pc"))
    text = arch.disassemble(pc)[0]["asm"]
    parts = text.split(None, 1)
    mnemonic, operands = (parts + [""])[:2]
    if mnemonic == "lock":
        locked += 1
        parts = operands.split(None, 1)
        mnemonic, operands = (parts + [""])[:2]
    elif mnemonic.startswith("xchg") and "(" in operands:
        locked += 1
    name = function_at(pc)
    counts = per_function.setdefault(name, [0, 0])
    counts[0] += 1
    total += 1
    if writes_memory(mnemonic, operands):
        counts[1] += 1
        stores += 1
    gdb.execute("stepi", to_string=True)
    if int(gdb.parse_and_eval("$sp")) >= caller_sp and total > 5:
        break  # returned from the call
print(f"{FUNCTION}: {total} instructions, {stores} stores, {locked} locked")
print("instructions stores function")
for name, (n, s) in sorted(per_function.items(), key=lambda kv: -kv[1][0])[:30]:
    print(f"{n:6d} {s:6d} {name[:120]}")
gdb.execute("kill")
