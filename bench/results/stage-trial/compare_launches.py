import json,sys,math,statistics as st
def cells(f):
    d=json.load(open(f)); out={}
    for run in d['runs']:
        for row in run['rows']:
            out[(run['nranks'],run['collective'],row['size'])]=(row['ferroccl']['oop']['time_us'],row['ompi']['oop']['time_us'])
    return out
a_name,b_name,reps=sys.argv[1],sys.argv[2],int(sys.argv[3])
for tag in ['','-fresh']:
    A=[cells(f'{a_name}{tag}-{r}.json') for r in range(1,reps+1)]; B=[cells(f'{b_name}{tag}-{r}.json') for r in range(1,reps+1)]
    print('==', tag or 'reused', f': per cell, time us per launch: {a_name} | {b_name} | Open MPI (all launches) | median {b_name}/{a_name}')
    lg=[];ba=bb=0
    for k in sorted(A[0]):
        ta=[x[k][0] for x in A]; tb=[x[k][0] for x in B]; om=[x[k][1] for x in A+B]
        r=st.median(tb)/st.median(ta); lg.append(math.log(r))
        a_below=st.median(ta)>st.median(om); b_below=st.median(tb)>st.median(om); ba+=a_below; bb+=b_below
        print(f'{k[0]} {k[1]:15s} {k[2]:>8d} | ' + ' '.join(f'{x:.1f}' for x in ta)+' | '+' '.join(f'{x:.1f}' for x in tb)+f' | {min(om):.1f}-{max(om):.1f} | {r:.2f}' + (' base<OMPI' if a_below else '') + (' trial<OMPI' if b_below else ''))
    print(f'geomean {b_name}/{a_name} {math.exp(sum(lg)/len(lg)):.3f}; cells whose median is below Open MPI median: {a_name} {ba}, {b_name} {bb} of {len(lg)}')
