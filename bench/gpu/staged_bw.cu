// All-reduce bus bandwidth on device buffers next to host buffers, in one run, through the same
// library: the network path from device memory (pinned staging, pieces overlapped with the
// transfers) against the host path over the same transport. Ranks are MPI processes; with
// FERROCCL_BENCH_PSK set (a key of at least 32 bytes) the run is encrypted (ncclSetEncryption).
// Force sockets between ranks of one host with NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1.
// "host cold" is the host call again after each rank has written a buffer larger than the last
// level cache (STAGED_BW_EVICT_MIB, default 512): its buffers come from DRAM, as the staged
// path's do (the stream's DMA writes them), instead of from cache as in a benchmark loop.
// "floor" is the cold host call while the stream runs the staging copies of the same bytes: the
// host memory traffic of the staged path, with its copies perfectly overlapped, from DRAM.
//   nvcc -O2 -I$PREFIX/include staged_bw.cu -L$PREFIX/lib -lnccl -lmpi -o staged_bw
//   mpirun -np 2 -x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1 ./staged_bw [min_MiB] [max_MiB]
// STAGED_BW_DETAIL=1: rank 0 also prints every device call with what happened during it: the
// host's TCP loss-recovery counters (loopback: both ranks' sockets) and, on each rank, the
// time its threads spent runnable but not running (schedstat), with the thread that waited
// longest. Read outside the timed window, between the barrier-delimited calls. Each rank also
// prints the call's start and end in wall-clock microseconds modulo 1e9 (the clock of the
// library's TRACE lines, NCCL_DEBUG=TRACE NCCL_DEBUG_SUBSYS=COLL).
#include <cuda_runtime.h>
#include <dirent.h>
#include <mpi.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <vector>
#include <algorithm>
#include <map>
#include <string>

#define CUDA(x) do { cudaError_t e = (x); if (e != cudaSuccess) { \
  fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e)); MPI_Abort(MPI_COMM_WORLD, 1); } } while (0)
#define NCCL(x) do { ncclResult_t r = (x); if (r != ncclSuccess) { \
  fprintf(stderr, "%s: %s\n", #x, ncclGetErrorString(r)); MPI_Abort(MPI_COMM_WORLD, 1); } } while (0)

static long long wall_us() {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return ((long long)ts.tv_sec * 1000000 + ts.tv_nsec / 1000) % 1000000000;
}

// One all-reduce of `count` floats, timed from a barrier to its completion on every rank.
static long long last_start_us, last_end_us;
static double time_one(const float* send, float* recv, size_t count, bool device, ncclComm_t comm,
                       cudaStream_t stream) {
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = MPI_Wtime();
  last_start_us = wall_us();
  NCCL(ncclAllReduce(send, recv, count, ncclFloat, ncclSum, comm, device ? stream : 0));
  if (device) CUDA(cudaStreamSynchronize(stream));
  last_end_us = wall_us();
  double dt = MPI_Wtime() - t0, worst;
  MPI_Allreduce(&dt, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return worst;
}

// Every rank sent 1.0 in every element.
static void verify(const float* r, size_t count, int nranks) {
  for (size_t i = 0; i < count; i += 4099)
    if (r[i] != (float)nranks) { fprintf(stderr, "wrong result at %zu: %f\n", i, r[i]); MPI_Abort(MPI_COMM_WORLD, 2); }
}

// The copies the staged path adds, alone: device to pinned host and back, on the stream.
static double time_copies(float* dev, float* pinned, size_t count, cudaStream_t stream) {
  double t0 = MPI_Wtime();
  CUDA(cudaMemcpyAsync(pinned, dev, count * sizeof(float), cudaMemcpyDeviceToHost, stream));
  CUDA(cudaMemcpyAsync(dev, pinned, count * sizeof(float), cudaMemcpyHostToDevice, stream));
  CUDA(cudaStreamSynchronize(stream));
  return MPI_Wtime() - t0;
}

// A host-buffer all-reduce while the stream copies the same bytes device -> pinned host ->
// device, as the staged path does: the host memory traffic of the staged path with its
// copies perfectly overlapped, i.e. its floor on a host whose memory bandwidth is the limit.
static double time_host_under_copies(const float* send, float* recv, size_t count, ncclComm_t comm, float* dev,
                                     float* pinned, cudaStream_t stream) {
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = MPI_Wtime();
  CUDA(cudaMemcpyAsync(pinned, dev, count * sizeof(float), cudaMemcpyDeviceToHost, stream));
  CUDA(cudaMemcpyAsync(dev, pinned, count * sizeof(float), cudaMemcpyHostToDevice, stream));
  NCCL(ncclAllReduce(send, recv, count, ncclFloat, ncclSum, comm, 0));
  CUDA(cudaStreamSynchronize(stream));
  double dt = MPI_Wtime() - t0, worst;
  MPI_Allreduce(&dt, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return worst;
}

// Counters of /proc/net/netstat and /proc/net/snmp ("TcpExt:" and "Tcp:" name/value line pairs).
static std::map<std::string, long long> tcp_counters() {
  std::map<std::string, long long> out;
  for (const char* path : {"/proc/net/netstat", "/proc/net/snmp"}) {
    FILE* f = fopen(path, "r");
    if (!f) continue;
    char names[8192], values[8192];
    while (fgets(names, sizeof names, f) && fgets(values, sizeof values, f)) {
      if (strncmp(names, "TcpExt:", 7) && strncmp(names, "Tcp:", 4)) continue;
      char *sn, *sv, *n = strtok_r(names, " \n", &sn), *v = strtok_r(values, " \n", &sv);
      for (n = strtok_r(0, " \n", &sn), v = strtok_r(0, " \n", &sv); n && v;
           n = strtok_r(0, " \n", &sn), v = strtok_r(0, " \n", &sv))
        out[n] = atoll(v);
    }
    fclose(f);
  }
  return out;
}

// Per thread of this process: nanoseconds spent waiting on a run queue (schedstat's second field).
static std::map<int, std::pair<long long, std::string>> run_delays() {
  std::map<int, std::pair<long long, std::string>> out;
  DIR* d = opendir("/proc/self/task");
  if (!d) return out;
  while (struct dirent* e = readdir(d)) {
    int tid = atoi(e->d_name);
    if (tid <= 0) continue;
    char path[128], name[64] = "?";
    long long run = 0, wait = 0;
    snprintf(path, sizeof path, "/proc/self/task/%d/schedstat", tid);
    if (FILE* f = fopen(path, "r")) { if (fscanf(f, "%lld %lld", &run, &wait) != 2) wait = 0; fclose(f); }
    snprintf(path, sizeof path, "/proc/self/task/%d/comm", tid);
    if (FILE* f = fopen(path, "r")) { if (fgets(name, sizeof name, f)) name[strcspn(name, "\n")] = 0; fclose(f); }
    out[tid] = {wait, name};
  }
  closedir(d);
  return out;
}

// What one rank saw during a call: its threads' total run-queue wait and the longest one's.
struct Waits {
  long long start_us, end_us;
  double total_us, worst_us;
  char worst_name[32];
};

static Waits waits_between(const std::map<int, std::pair<long long, std::string>>& a,
                           const std::map<int, std::pair<long long, std::string>>& b) {
  Waits w = {last_start_us, last_end_us, 0, 0, "-"};
  for (auto& [tid, now] : b) {
    auto was = a.find(tid);
    double us = (now.first - (was == a.end() ? 0 : was->second.first)) / 1e3;
    w.total_us += us;
    if (us > w.worst_us) {
      w.worst_us = us;
      snprintf(w.worst_name, sizeof w.worst_name, "%s", now.second.c_str());
    }
  }
  return w;
}

static double median(std::vector<double> t) {
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, nranks;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  size_t evict_bytes = (size_t)(getenv("STAGED_BW_EVICT_MIB") ? atoi(getenv("STAGED_BW_EVICT_MIB")) : 512) << 20;
  std::vector<char> junk(evict_bytes);
  size_t min_mib = argc > 1 ? strtoull(argv[1], 0, 10) : 1, max_mib = argc > 2 ? strtoull(argv[2], 0, 10) : 256;
  const char* psk = getenv("FERROCCL_BENCH_PSK");
  if (psk) {
    ncclEncryptionConfig_t enc = NCCL_ENCRYPTION_CONFIG_INITIALIZER;
    enc.mode = NCCL_ENCRYPTION_MODE_PSK;
    enc.psk = psk;
    NCCL(ncclSetEncryption(&enc));
  }
  // STAGED_BW_BLOCKING_SYNC=1: the calling thread sleeps in cudaStreamSynchronize instead of
  // spinning (leaves its core to the library's stream worker).
  if (getenv("STAGED_BW_BLOCKING_SYNC")) CUDA(cudaSetDeviceFlags(cudaDeviceScheduleBlockingSync));
  CUDA(cudaSetDevice(0));
  ncclUniqueId id;
  if (rank == 0) NCCL(ncclGetUniqueId(&id));
  MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t comm;
  NCCL(ncclCommInitRank(&comm, nranks, id, rank));
  cudaStream_t stream;
  CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  size_t max_count = (max_mib << 20) / sizeof(float);
  float *dsend, *drecv;
  CUDA(cudaMalloc(&dsend, max_count * sizeof(float)));
  CUDA(cudaMalloc(&drecv, max_count * sizeof(float)));
  std::vector<float> hsend(max_count, 1.0f), hrecv(max_count), check(max_count);
  float *scratch, *pinned;
  CUDA(cudaMalloc(&scratch, max_count * sizeof(float)));
  CUDA(cudaMallocHost(&pinned, max_count * sizeof(float)));
  CUDA(cudaMemcpy(dsend, hsend.data(), max_count * sizeof(float), cudaMemcpyHostToDevice));
  if (rank == 0)
    printf("# %d ranks, %s; busbw = bytes * 2(n-1)/n / time (GB/s), median; then times in us; cold = the\n"
           "# host call with its buffers evicted from cache first; copies = the same bytes device -> pinned host\n"
           "# -> device on the stream, alone; floor = a cold host call while the stream runs those copies;\n"
           "# r-X = device busbw / X busbw\n"
           "# %10s %8s %8s %8s %8s %7s %7s %7s %8s %8s %8s %8s %8s\n", nranks,
           psk ? "TLS (ncclSetEncryption)" : "plaintext", "bytes", "host", "cold", "floor", "device", "r-host",
           "r-cold", "r-floor", "host", "cold", "floor", "device", "copies");
  bool detail = getenv("STAGED_BW_DETAIL") != nullptr;
  const char* tcp_names[] = {"RetransSegs", "TCPFastRetrans", "TCPLossProbes", "TCPTimeouts", "TCPOFOQueue",
                             "TCPSACKReorder", "TCPTSReorder", "TCPDSACKRecv"};
  if (detail && rank == 0)
    printf("# detail: MiB call us | TCP deltas (retrans fastretrans lossprobes timeouts ofoqueue sackreorder "
           "tsreorder dsackrecv) | per rank: run-queue wait total us, longest us (thread) | per rank: wall us "
           "@start-end\n");
  // Host and device operations alternate, so that both columns see the same state of the
  // machine (loopback TCP between processes on a shared host drifts by up to 2x over a run).
  for (size_t mib = min_mib; mib <= max_mib; mib *= 2) {
    size_t count = (mib << 20) / sizeof(float);
    int iters = mib >= 64 ? 8 : mib >= 16 ? 16 : 30;
    std::vector<double> th, td, tk, tc, tu;
    for (int i = 0; i < iters + 2; i++) {
      double a = time_one(hsend.data(), hrecv.data(), count, false, comm, stream);
      auto tcp0 = detail && rank == 0 ? tcp_counters() : std::map<std::string, long long>();
      auto rq0 = detail ? run_delays() : std::map<int, std::pair<long long, std::string>>();
      double b = time_one(dsend, drecv, count, true, comm, stream);
      if (detail) {
        Waits mine = waits_between(rq0, run_delays());
        std::vector<Waits> all(nranks);
        MPI_Gather(&mine, sizeof mine, MPI_BYTE, all.data(), sizeof mine, MPI_BYTE, 0, MPI_COMM_WORLD);
        if (rank == 0) {
          auto tcp1 = tcp_counters();
          printf("  detail %4zu %3d %9.0f |", mib, i, b * 1e6);
          for (const char* n : tcp_names) printf(" %lld", tcp1[n] - tcp0[n]);
          printf(" |");
          for (auto& w : all) printf(" %.0f %.0f (%s)", w.total_us, w.worst_us, w.worst_name);
          printf(" | wall");
          for (auto& w : all) printf(" @%lld-%lld", w.start_us, w.end_us);
          printf("\n");
        }
      }
      memset(junk.data(), i, junk.size());
      asm volatile("" : : "r"(junk.data()) : "memory");  // the eviction is not dead code
      double k = time_one(hsend.data(), hrecv.data(), count, false, comm, stream);
      double c = time_copies(scratch, pinned, count, stream);
      memset(junk.data(), i + 1, junk.size());
      asm volatile("" : : "r"(junk.data()) : "memory");
      double u = time_host_under_copies(hsend.data(), hrecv.data(), count, comm, scratch, pinned, stream);
      if (i >= 2) { th.push_back(a); td.push_back(b); tk.push_back(k); tc.push_back(c); tu.push_back(u); }
    }
    verify(hrecv.data(), count, nranks);
    CUDA(cudaMemcpy(check.data(), drecv, count * sizeof(float), cudaMemcpyDeviceToHost));
    verify(check.data(), count, nranks);
    double f = 2.0 * (nranks - 1) / nranks * (double)(mib << 20) / 1e9, mh = median(th), md = median(td),
           mk = median(tk), mu = median(tu);
    if (rank == 0)
      printf("  %10zu %8.2f %8.2f %8.2f %8.2f %7.2f %7.2f %7.2f %8.0f %8.0f %8.0f %8.0f %8.0f\n", mib << 20, f / mh,
             f / mk, f / mu, f / md, mh / md, mk / md, mu / md, mh * 1e6, mk * 1e6, mu * 1e6, md * 1e6,
             median(tc) * 1e6);
  }
  NCCL(ncclCommDestroy(comm));
  MPI_Finalize();
  return 0;
}
