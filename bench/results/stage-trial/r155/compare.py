# Prints round 155's cells: best of two launches per build, base (fb = 995a46a) against the trial
# (fb-trial = 4ce5c30), reused and fresh inputs, and geometric means per rank count.
import json, math
def cells(f):
    d = json.load(open(f)); out = {}
    for run in d['runs']:
        for row in run['rows']:
            out[(run['nranks'], run['collective'], row['size'])] = (row['ferroccl']['oop']['time_us'], row['ompi']['oop']['time_us'])
    return out
for tag in ['', '-fresh']:
    A = [cells(f'fb{tag}-{r}.json') for r in (1, 2)]; B = [cells(f'fb-trial{tag}-{r}.json') for r in (1, 2)]
    print('==', tag or 'reused', ': base launches | trial launches | Open MPI (all) | best trial / best base')
    for k in sorted(A[0]):
        ta = [x[k][0] for x in A]; tb = [x[k][0] for x in B]; om = [x[k][1] for x in A + B]
        print(f'{k[0]:2d} {k[1]:15s} {k[2]:>8d} | ' + ' '.join(f'{x:.1f}' for x in ta) + ' | ' + ' '.join(f'{x:.1f}' for x in tb) + f' | {min(om):.1f}-{max(om):.1f} | {min(tb)/min(ta):.2f}')
    for n in (2, 8, 16):
        lg = [math.log(min(x[k][0] for x in B) / min(x[k][0] for x in A)) for k in A[0] if k[0] == n]
        print(f'{n} ranks: geometric mean {math.exp(sum(lg)/len(lg)):.3f}')
