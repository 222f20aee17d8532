//! The correctness matrix: collectives x types x operators x counts x in-place x rank counts,
//! ranks as threads, results compared with independently computed references.

use std::ffi::c_void;

use ferroccl::ffi::coll::*;
use ferroccl::ffi::group::{ncclGroupEnd, ncclGroupStart};
use ferroccl::ffi::query::{ncclRedOpCreatePreMulSum, ncclRedOpDestroy};
use ferroccl::types::{ncclDataType_t, ncclRedOp_t, ncclScalarResidence_t, DataType};

use crate::common::*;

const OPS: [&str; 5] = ["sum", "prod", "max", "min", "avg"];
/// 0, tiny, below the rank count, odd, and large enough for the pipelined ring.
const COUNTS: [usize; 5] = [0, 1, 3, 1001, 70_001];
const NULL_STREAM: *mut c_void = std::ptr::null_mut();

fn dt(d: DataType) -> ncclDataType_t {
    d.to_raw()
}

fn counts_for(d: DataType) -> Vec<usize> {
    // The big count only for a few types, to keep the suite fast on 2 cores.
    COUNTS
        .iter()
        .copied()
        .filter(|&c| c < 10_000 || matches!(d, DataType::Float32 | DataType::Int8 | DataType::Bfloat16))
        .collect()
}

fn all_reduce_matrix(n: usize) {
    with_ranks(n, move |rank, comm| {
        for d in DataType::ALL {
            for op in OPS {
                for count in counts_for(d) {
                    let input = inputs(d, op, rank, count);
                    let want = all_reduced(d, op, n, count);
                    // Out of place.
                    let mut out = vec![0xAAu8; input.len()];
                    check(
                        ncclAllReduce(
                            input.as_ptr().cast(),
                            out.as_mut_ptr().cast(),
                            count,
                            dt(d),
                            ncclRedOp_t(op_code(op)),
                            comm.0,
                            NULL_STREAM,
                        ),
                        "ncclAllReduce",
                    );
                    compare(d, op, &out, &want, &format!("allreduce n={n} {d} {op} count={count} rank={rank}"));
                    // In place.
                    let mut buf = input.clone();
                    check(
                        ncclAllReduce(
                            buf.as_ptr().cast(),
                            buf.as_mut_ptr().cast(),
                            count,
                            dt(d),
                            ncclRedOp_t(op_code(op)),
                            comm.0,
                            NULL_STREAM,
                        ),
                        "ncclAllReduce in place",
                    );
                    compare(
                        d,
                        op,
                        &buf,
                        &want,
                        &format!("allreduce in-place n={n} {d} {op} count={count} rank={rank}"),
                    );
                }
            }
        }
    });
}

#[test]
fn all_reduce_1_rank() {
    all_reduce_matrix(1);
}
#[test]
fn all_reduce_2_ranks() {
    all_reduce_matrix(2);
}
#[test]
fn all_reduce_3_ranks() {
    all_reduce_matrix(3);
}
#[test]
fn all_reduce_5_ranks() {
    all_reduce_matrix(5);
}

fn reduce_and_reduce_scatter(n: usize) {
    with_ranks(n, move |rank, comm| {
        for d in [
            DataType::Int32,
            DataType::Float32,
            DataType::Float16,
            DataType::Uint8,
            DataType::Float8e5m2,
            DataType::Float64,
        ] {
            for op in OPS {
                for count in counts_for(d) {
                    let want = all_reduced(d, op, n, count);
                    for root in 0..n {
                        let input = inputs(d, op, rank, count);
                        let mut out = vec![0x55u8; input.len()];
                        check(
                            ncclReduce(
                                input.as_ptr().cast(),
                                out.as_mut_ptr().cast(),
                                count,
                                dt(d),
                                ncclRedOp_t(op_code(op)),
                                root as i32,
                                comm.0,
                                NULL_STREAM,
                            ),
                            "ncclReduce",
                        );
                        if rank == root {
                            compare(d, op, &out, &want, &format!("reduce n={n} root={root} {d} {op} count={count}"));
                        }
                        let mut buf = input.clone();
                        check(
                            ncclReduce(
                                buf.as_ptr().cast(),
                                buf.as_mut_ptr().cast(),
                                count,
                                dt(d),
                                ncclRedOp_t(op_code(op)),
                                root as i32,
                                comm.0,
                                NULL_STREAM,
                            ),
                            "ncclReduce in place",
                        );
                        if rank == root {
                            compare(
                                d,
                                op,
                                &buf,
                                &want,
                                &format!("reduce in-place n={n} root={root} {d} {op} count={count}"),
                            );
                        }
                    }
                    // Reduce-scatter: every rank contributes n*count elements; rank r keeps block r.
                    let input = inputs(d, op, rank, n * count);
                    let full = all_reduced(d, op, n, n * count);
                    let es = d.size();
                    let mine = &full[rank * count * es..(rank + 1) * count * es];
                    let mut out = vec![0x11u8; count * es];
                    check(
                        ncclReduceScatter(
                            input.as_ptr().cast(),
                            out.as_mut_ptr().cast(),
                            count,
                            dt(d),
                            ncclRedOp_t(op_code(op)),
                            comm.0,
                            NULL_STREAM,
                        ),
                        "ncclReduceScatter",
                    );
                    compare(d, op, &out, mine, &format!("reducescatter n={n} {d} {op} count={count}"));
                    let mut buf = input.clone();
                    let base = buf.as_mut_ptr();
                    check(
                        ncclReduceScatter(
                            base.cast(),
                            base.wrapping_add(rank * count * es).cast(),
                            count,
                            dt(d),
                            ncclRedOp_t(op_code(op)),
                            comm.0,
                            NULL_STREAM,
                        ),
                        "ncclReduceScatter in place",
                    );
                    compare(
                        d,
                        op,
                        &buf[rank * count * es..(rank + 1) * count * es],
                        mine,
                        &format!("reducescatter in-place n={n} {d} {op} count={count}"),
                    );
                }
            }
        }
    });
}

#[test]
fn reduce_and_reduce_scatter_1_rank() {
    reduce_and_reduce_scatter(1);
}
#[test]
fn reduce_and_reduce_scatter_2_ranks() {
    reduce_and_reduce_scatter(2);
}
#[test]
fn reduce_and_reduce_scatter_3_ranks() {
    reduce_and_reduce_scatter(3);
}
#[test]
fn reduce_and_reduce_scatter_4_ranks() {
    reduce_and_reduce_scatter(4);
}

/// Data movement collectives: the payload is a pattern of (rank, index) bytes.
fn pattern(rank: usize, len: usize, salt: u8) -> Vec<u8> {
    (0..len).map(|i| (rank as u8).wrapping_mul(37).wrapping_add(i as u8).wrapping_add(salt)).collect()
}

fn movement(n: usize) {
    with_ranks(n, move |rank, comm| {
        for d in [DataType::Int8, DataType::Float32, DataType::Float64, DataType::Bfloat16] {
            let es = d.size();
            for count in [0usize, 1, 5, 1000, 100_003] {
                let bytes = count * es;
                // Broadcast from each root, out of place and in place (ncclBcast).
                for root in 0..n {
                    let src = pattern(root, bytes, 1);
                    let send = if rank == root { src.clone() } else { vec![0u8; bytes] };
                    let mut out = vec![0xEEu8; bytes];
                    check(
                        ncclBroadcast(
                            send.as_ptr().cast(),
                            out.as_mut_ptr().cast(),
                            count,
                            dt(d),
                            root as i32,
                            comm.0,
                            NULL_STREAM,
                        ),
                        "ncclBroadcast",
                    );
                    assert_eq!(out, src, "broadcast n={n} root={root} count={count}");
                    let mut buf = if rank == root { src.clone() } else { vec![0u8; bytes] };
                    check(
                        ncclBcast(buf.as_mut_ptr().cast(), count, dt(d), root as i32, comm.0, NULL_STREAM),
                        "ncclBcast",
                    );
                    assert_eq!(buf, src, "bcast n={n} root={root} count={count}");
                }
                // All-gather, out of place and in place.
                let mine = pattern(rank, bytes, 2);
                let want: Vec<u8> = (0..n).flat_map(|r| pattern(r, bytes, 2)).collect();
                let mut out = vec![0xEEu8; n * bytes];
                check(
                    ncclAllGather(mine.as_ptr().cast(), out.as_mut_ptr().cast(), count, dt(d), comm.0, NULL_STREAM),
                    "ncclAllGather",
                );
                assert_eq!(out, want, "allgather n={n} count={count}");
                let mut buf = vec![0u8; n * bytes];
                buf[rank * bytes..(rank + 1) * bytes].copy_from_slice(&mine);
                let base = buf.as_mut_ptr();
                check(
                    ncclAllGather(
                        base.wrapping_add(rank * bytes).cast(),
                        base.cast(),
                        count,
                        dt(d),
                        comm.0,
                        NULL_STREAM,
                    ),
                    "ncclAllGather in place",
                );
                assert_eq!(buf, want, "allgather in-place n={n} count={count}");
                // All-to-all: block j of rank r is pattern(r*n+j).
                let send: Vec<u8> = (0..n).flat_map(|j| pattern(rank * n + j, bytes, 3)).collect();
                let want: Vec<u8> = (0..n).flat_map(|i| pattern(i * n + rank, bytes, 3)).collect();
                let mut out = vec![0xEEu8; n * bytes];
                check(
                    ncclAlltoAll(send.as_ptr().cast(), out.as_mut_ptr().cast(), count, dt(d), comm.0, NULL_STREAM),
                    "ncclAlltoAll",
                );
                assert_eq!(out, want, "alltoall n={n} count={count}");
                let mut buf = send.clone();
                check(
                    ncclAlltoAll(buf.as_ptr().cast(), buf.as_mut_ptr().cast(), count, dt(d), comm.0, NULL_STREAM),
                    "ncclAlltoAll in place",
                );
                assert_eq!(buf, want, "alltoall in-place n={n} count={count}");
                // Gather and scatter at each root.
                for root in 0..n {
                    let mut out = vec![0xEEu8; n * bytes];
                    check(
                        ncclGather(
                            mine.as_ptr().cast(),
                            out.as_mut_ptr().cast(),
                            count,
                            dt(d),
                            root as i32,
                            comm.0,
                            NULL_STREAM,
                        ),
                        "ncclGather",
                    );
                    if rank == root {
                        let want: Vec<u8> = (0..n).flat_map(|r| pattern(r, bytes, 2)).collect();
                        assert_eq!(out, want, "gather n={n} root={root} count={count}");
                    }
                    let blocks: Vec<u8> = (0..n).flat_map(|r| pattern(r + 100, bytes, 4)).collect();
                    let send = if rank == root { blocks.clone() } else { Vec::new() };
                    let mut out = vec![0xEEu8; bytes];
                    check(
                        ncclScatter(
                            if rank == root { send.as_ptr().cast() } else { std::ptr::null() },
                            out.as_mut_ptr().cast(),
                            count,
                            dt(d),
                            root as i32,
                            comm.0,
                            NULL_STREAM,
                        ),
                        "ncclScatter",
                    );
                    assert_eq!(out, pattern(rank + 100, bytes, 4), "scatter n={n} root={root} count={count}");
                }
            }
        }
    });
}

#[test]
fn movement_1_rank() {
    movement(1);
}
#[test]
fn movement_2_ranks() {
    movement(2);
}
#[test]
fn movement_3_ranks() {
    movement(3);
}
#[test]
fn movement_5_ranks() {
    movement(5);
}
#[test]
fn movement_8_ranks() {
    movement(8);
}

/// Grouped send/recv in a ring and to self, mixed with a collective, in one group.
#[test]
fn grouped_send_recv_and_collective() {
    let n = 4;
    with_ranks(n, move |rank, comm| {
        let d = DataType::Float32;
        let count = 50_000;
        let bytes = count * 4;
        let next = (rank + 1) % n;
        let prev = (rank + n - 1) % n;
        let to_next = pattern(rank, bytes, 9);
        let to_self = pattern(rank + 50, bytes, 9);
        let mut from_prev = vec![0u8; bytes];
        let mut from_self = vec![0u8; bytes];
        let ar_in = inputs(d, "sum", rank, count);
        let mut ar_out = vec![0u8; bytes];
        check(ncclGroupStart(), "ncclGroupStart");
        check(ncclGroupStart(), "nested ncclGroupStart");
        // Receive posted before send on even ranks, after on odd ones: must not deadlock.
        if rank % 2 == 0 {
            check(ncclRecv(from_prev.as_mut_ptr().cast(), count, dt(d), prev as i32, comm.0, NULL_STREAM), "ncclRecv");
            check(ncclSend(to_next.as_ptr().cast(), count, dt(d), next as i32, comm.0, NULL_STREAM), "ncclSend");
        } else {
            check(ncclSend(to_next.as_ptr().cast(), count, dt(d), next as i32, comm.0, NULL_STREAM), "ncclSend");
            check(ncclRecv(from_prev.as_mut_ptr().cast(), count, dt(d), prev as i32, comm.0, NULL_STREAM), "ncclRecv");
        }
        check(ncclGroupEnd(), "nested ncclGroupEnd");
        check(ncclSend(to_self.as_ptr().cast(), count, dt(d), rank as i32, comm.0, NULL_STREAM), "ncclSend self");
        check(ncclRecv(from_self.as_mut_ptr().cast(), count, dt(d), rank as i32, comm.0, NULL_STREAM), "ncclRecv self");
        check(
            ncclAllReduce(
                ar_in.as_ptr().cast(),
                ar_out.as_mut_ptr().cast(),
                count,
                dt(d),
                ncclRedOp_t(0),
                comm.0,
                NULL_STREAM,
            ),
            "ncclAllReduce in group",
        );
        check(ncclGroupEnd(), "ncclGroupEnd");
        assert_eq!(from_prev, pattern(prev, bytes, 9));
        assert_eq!(from_self, to_self);
        compare(d, "sum", &ar_out, &all_reduced(d, "sum", n, count), "allreduce inside group");
    });
}

/// PreMulSum with host-immediate scalars (rank-dependent, as nccl-tests does).
#[test]
fn pre_mul_sum() {
    let n = 3;
    with_ranks(n, move |rank, comm| {
        for d in [DataType::Float32, DataType::Float64, DataType::Int32, DataType::Float16] {
            let scalar_val = if rank % 2 == 0 { 1.0 } else { 2.0 };
            let mut scalar = Vec::new();
            encode(d, Val::Float(scalar_val), &mut scalar);
            let mut op = ncclRedOp_t(-1);
            check(
                ncclRedOpCreatePreMulSum(&mut op, scalar.as_mut_ptr().cast(), dt(d), ncclScalarResidence_t(1), comm.0),
                "ncclRedOpCreatePreMulSum",
            );
            assert!(op.0 >= 5);
            let count = 2000;
            let input = inputs(d, "sum", rank, count);
            let mut out = vec![0u8; input.len()];
            check(
                ncclAllReduce(input.as_ptr().cast(), out.as_mut_ptr().cast(), count, dt(d), op, comm.0, NULL_STREAM),
                "ncclAllReduce premulsum",
            );
            let mut want = Vec::new();
            for i in 0..count {
                let vals: Vec<Val> = (0..n)
                    .map(|r| {
                        let s = if r % 2 == 0 { 1.0 } else { 2.0 };
                        match crate::common::input(d, "sum", r, i) {
                            Val::Int(x) => Val::Int(x * s as i128),
                            Val::Float(x) => Val::Float(x * s),
                        }
                    })
                    .collect();
                reduce_expected(d, "sum", &vals, &mut want);
            }
            compare(d, "sum", &out, &want, &format!("premulsum {d}"));
            check(ncclRedOpDestroy(op, comm.0), "ncclRedOpDestroy");
        }
    });
}

/// One rank: a call outside a group takes the local shortcut, the same call inside a group the
/// general path; both must give the same bytes, for every collective, in place, out of place,
/// with overlapping buffers, and with PreMulSum and average scaling.
#[test]
fn one_rank_shortcut_matches_the_general_path() {
    with_ranks(1, |_, comm| {
        let count = 1001;
        for d in [DataType::Float32, DataType::Bfloat16, DataType::Int32, DataType::Float64] {
            let mut scalar = Vec::new();
            encode(d, Val::Float(3.0), &mut scalar);
            let mut premul = ncclRedOp_t(-1);
            check(
                ncclRedOpCreatePreMulSum(
                    &mut premul,
                    scalar.as_mut_ptr().cast(),
                    dt(d),
                    ncclScalarResidence_t(1),
                    comm.0,
                ),
                "ncclRedOpCreatePreMulSum",
            );
            let ops = [ncclRedOp_t(0), ncclRedOp_t(3), ncclRedOp_t(4), premul];
            let es = d.size();
            let input = inputs(d, "sum", 0, count);
            // Send at `s`, receive at `r` (element offsets) in one buffer of 2 * count elements.
            for (s, r) in [(0, count), (0, 0), (0, 7), (7, 0)] {
                for (k, &op) in ops.iter().enumerate() {
                    for coll in ["allreduce", "reduce", "reducescatter", "allgather", "broadcast", "alltoall"] {
                        let run = |grouped: bool| -> Vec<u8> {
                            let mut buf = vec![0x5au8; 2 * count * es];
                            buf[s * es..(s + count) * es].copy_from_slice(&input);
                            let send = buf[s * es..].as_ptr() as *const c_void;
                            let recv = buf[r * es..].as_mut_ptr() as *mut c_void;
                            if grouped {
                                check(ncclGroupStart(), "ncclGroupStart");
                            }
                            let rc = match coll {
                                "allreduce" => ncclAllReduce(send, recv, count, dt(d), op, comm.0, NULL_STREAM),
                                "reduce" => ncclReduce(send, recv, count, dt(d), op, 0, comm.0, NULL_STREAM),
                                "reducescatter" => ncclReduceScatter(send, recv, count, dt(d), op, comm.0, NULL_STREAM),
                                "allgather" => ncclAllGather(send, recv, count, dt(d), comm.0, NULL_STREAM),
                                "broadcast" => ncclBroadcast(send, recv, count, dt(d), 0, comm.0, NULL_STREAM),
                                _ => ncclAlltoAll(send, recv, count, dt(d), comm.0, NULL_STREAM),
                            };
                            check(rc, coll);
                            if grouped {
                                check(ncclGroupEnd(), "ncclGroupEnd");
                            }
                            buf
                        };
                        let what = format!("{coll} {d} op #{k} send at {s} receive at {r}");
                        let (alone, grouped) = (run(false), run(true));
                        assert!(alone == grouped, "{what}: the shortcut and the general path differ");
                        // And both are right: the input, scaled where the operator says so.
                        let got = &alone[r * es..(r + count) * es];
                        let reducing = matches!(coll, "allreduce" | "reduce" | "reducescatter");
                        let want: Vec<u8> = if reducing && k == 3 {
                            let mut w = Vec::new();
                            for i in 0..count {
                                let v = match crate::common::input(d, "sum", 0, i) {
                                    Val::Int(x) => Val::Int(x * 3),
                                    Val::Float(x) => Val::Float(x * 3.0),
                                };
                                reduce_expected(d, "sum", &[v], &mut w);
                            }
                            w
                        } else {
                            input.clone()
                        };
                        compare(d, "sum", got, &want, &what);
                    }
                }
            }
            check(ncclRedOpDestroy(premul, comm.0), "ncclRedOpDestroy");
        }
    });
}

/// NaN and Inf propagate through sum and max.
#[test]
fn nan_and_inf_propagate() {
    let n = 3;
    let got = with_ranks(n, move |rank, comm| {
        let mut input = [1.0f32; 4];
        if rank == 1 {
            input[0] = f32::NAN;
            input[1] = f32::INFINITY;
        }
        if rank == 2 {
            input[2] = f32::NEG_INFINITY;
        }
        let mut sum = vec![0f32; 4];
        let mut max = vec![0f32; 4];
        check(
            ncclAllReduce(
                input.as_ptr().cast(),
                sum.as_mut_ptr().cast(),
                4,
                dt(DataType::Float32),
                ncclRedOp_t(0),
                comm.0,
                NULL_STREAM,
            ),
            "sum",
        );
        check(
            ncclAllReduce(
                input.as_ptr().cast(),
                max.as_mut_ptr().cast(),
                4,
                dt(DataType::Float32),
                ncclRedOp_t(2),
                comm.0,
                NULL_STREAM,
            ),
            "max",
        );
        (sum, max)
    });
    for (sum, max) in got {
        assert!(sum[0].is_nan() && sum[1] == f32::INFINITY && sum[2] == f32::NEG_INFINITY && sum[3] == 3.0);
        assert!(max[0].is_nan() && max[1] == f32::INFINITY && max[2] == 1.0);
    }
}

/// A ncclScalarDevice scalar is read when the collective runs, not when the operator is made.
#[test]
fn pre_mul_sum_pointer_scalar_is_read_at_use() {
    with_ranks(2, |rank, comm| {
        let mut scalar = 5.0f64;
        let mut op = ncclRedOp_t(-1);
        check(
            ncclRedOpCreatePreMulSum(
                &mut op,
                (&mut scalar as *mut f64).cast(),
                dt(DataType::Float64),
                ncclScalarResidence_t(0),
                comm.0,
            ),
            "create",
        );
        scalar = rank as f64 + 2.0; // rank 0 multiplies by 2, rank 1 by 3
        let v = [1.0f64; 8];
        let mut out = [0f64; 8];
        check(
            ncclAllReduce(
                v.as_ptr().cast(),
                out.as_mut_ptr().cast(),
                8,
                dt(DataType::Float64),
                op,
                comm.0,
                NULL_STREAM,
            ),
            "allreduce",
        );
        assert_eq!(out, [5.0; 8]);
        let _ = scalar;
        check(ncclRedOpDestroy(op, comm.0), "destroy");
    });
}
