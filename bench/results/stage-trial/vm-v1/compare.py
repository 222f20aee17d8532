import json,sys
def cells(f):
    d=json.load(open(f)); out={}
    for run in d['runs']:
        for row in run['rows']:
            out[(run['nranks'],run['collective'],row['size'])]=(row['ferroccl']['oop']['time_us'],row['ompi']['oop']['time_us'])
    return out
for tag in ['','-fresh']:
    a=cells(f'all-base{tag}.json'); b=cells(f'all-trial{tag}.json')
    print('==', tag or 'reused', ' cells: base_us trial_us trial/base | ompi(base run) ompi(trial run)')
    for k in sorted(a):
        ta,oa=a[k]; tb,ob=b[k]
        flag = '  <-- slower' if tb>ta*1.15 else ('  faster' if tb<ta/1.15 else '')
        below = ' BELOW' if tb>ob else ''
        print(k, f'{ta:.1f} {tb:.1f} {tb/ta:.2f} | {oa:.1f} {ob:.1f}{flag}{below}')
