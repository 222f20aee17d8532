# Prints every cell of alternating compare_ompi.sh launches of two builds, reused and fresh
# inputs: the time of each launch, Open MPI's range, and the ratio of the two builds (median
# of launches, or the best with --best), with geometric means per rank count.
#   python3 compare_launches.py A B LAUNCHES [--best]   (files A-1.json, A-fresh-1.json, ...)
import json, math, statistics, sys

def cells(f):
    d = json.load(open(f)); out = {}
    for run in d['runs']:
        for row in run['rows']:
            out[(run['nranks'], run['collective'], row['size'])] = (row['ferroccl']['oop']['time_us'], row['ompi']['oop']['time_us'])
    return out

a_name, b_name, launches = sys.argv[1], sys.argv[2], int(sys.argv[3])
stat = min if '--best' in sys.argv else statistics.median
for tag in ['', '-fresh']:
    A = [cells(f'{a_name}{tag}-{r}.json') for r in range(1, launches + 1)]
    B = [cells(f'{b_name}{tag}-{r}.json') for r in range(1, launches + 1)]
    print('==', tag or 'reused', f': time us per launch: {a_name} | {b_name} | Open MPI (all launches) | {b_name} / {a_name} ({stat.__name__})')
    logs = {}; below_a = below_b = 0
    for k in sorted(A[0]):
        ta = [x[k][0] for x in A]; tb = [x[k][0] for x in B]; om = [x[k][1] for x in A + B]
        r = stat(tb) / stat(ta); logs.setdefault(k[0], []).append(math.log(r))
        a_below = stat(ta) > stat(om); b_below = stat(tb) > stat(om); below_a += a_below; below_b += b_below
        print(f'{k[0]:2d} {k[1]:15s} {k[2]:>8d} | ' + ' '.join(f'{x:.1f}' for x in ta) + ' | ' + ' '.join(f'{x:.1f}' for x in tb)
              + f' | {min(om):.1f}-{max(om):.1f} | {r:.2f}' + (f' {a_name}<OMPI' if a_below else '') + (f' {b_name}<OMPI' if b_below else ''))
    for n, lg in sorted(logs.items()):
        print(f'{n} ranks: geometric mean {b_name}/{a_name} {math.exp(sum(lg) / len(lg)):.3f}')
    print(f'cells below Open MPI ({stat.__name__} against {stat.__name__}): {a_name} {below_a}, {b_name} {below_b} of {sum(map(len, logs.values()))}')
