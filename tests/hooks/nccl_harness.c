/* Drives a profiler plugin the way NCCL does: dlopen, dlsym("ncclProfiler_vN"), init per
 * communicator, then start/record/stop events with descriptors laid out like NCCL's v4/v5/v6
 * (defined here independently of the plugin's own header, from the reference notes), then
 * finalize; prints the plugin's refusal (pulse_nccl_refusal, when exported) after the first
 * init as `refusal=<reason>|none count=N`. Exit status: 0 when every call returned 0 (ncclSuccess), 2 on a non-zero return,
 * 3 when the library or symbol is missing.
 *
 * usage: nccl_harness LIB VERSION [FLOOD_COLLS [THREADS]]
 * With THREADS > 0: instead of the script, THREADS threads each init their own comm
 * (commHash 0x1000 + i, rank 0 of 1) and issue FLOOD_COLLS AllReduces (count = index)
 * concurrently, then finalize.
 * Script per communicator (2 comms: rank 1 of 4 and rank 0 of 2):
 *   group{ coll AllReduce(seq 0, count 1024, float32, RING, SIMPLE, 2 ch) }
 *     -> proxyOp(channel 1, peer 2, send) -> proxyStep -> netPlugin(IB QP 0x1234, dev 1, 65536 B)
 *     -> proxyOp(channel 0, peer 0, recv) -> proxyStep -> netPlugin(IB QP 0x2222, dev 0)
 *   group{ coll AllGather(seq 0, count 256, bfloat16, TREE, LL128) }
 *   group{ send(peer 0, 100 x int32), recv(peer 2, 50 x int32), send(peer 2, 10 x int32) }
 *   group{ send(peer 3, 7 x float64) }
 *   coll Broadcast(root 2, count 8, uint8)
 *   FLOOD_COLLS more AllReduces
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

typedef int res_t;
typedef void (*logger_t)(int, unsigned long, const char*, int, const char*, ...);

/* ---- v4 descriptor: uint8_t type, no parentGroup */
typedef struct {
  uint8_t type;
  void* parentObj;
  int rank;
  union {
    struct { uint64_t seqNumber; const char* func; const void* sendBuff; void* recvBuff; size_t count; int root;
             const char* datatype; uint8_t nChannels; uint8_t nWarps; const char* algo; const char* proto; } coll;
    struct { const char* func; void* buff; const char* datatype; size_t count; int peer; uint8_t nChannels; } p2p;
    struct { pid_t pid; uint8_t channelId; int peer; int nSteps; int chunkSize; int isSend; } proxyOp;
    struct { int step; } proxyStep;
    struct { uint8_t channelId; uint64_t pTimer; } kernelCh;
    struct { int64_t id; void* data; } netPlugin;
  };
} descr_v4_t;

/* ---- v5 descriptor: uint64_t type, API events, parentGroup */
#define V5_UNION_MEMBERS                                                                                   \
  struct { bool graphCaptured; int groupDepth; } groupApi;                                                \
  struct { const char* func; size_t count; const char* datatype; int root; void* stream; bool graphCaptured; } collApi; \
  struct { const char* func; size_t count; const char* datatype; void* stream; bool graphCaptured; } p2pApi; \
  struct { void* stream; } kernelLaunch;                                                                  \
  struct { uint64_t seqNumber; const char* func; const void* sendBuff; void* recvBuff; size_t count; int root; \
           const char* datatype; uint8_t nChannels; uint8_t nWarps; const char* algo; const char* proto;    \
           void* parentGroup; } coll;                                                                      \
  struct { const char* func; void* buff; const char* datatype; size_t count; int peer; uint8_t nChannels;   \
           void* parentGroup; } p2p;                                                                       \
  struct { pid_t pid; uint8_t channelId; int peer; int nSteps; int chunkSize; int isSend; } proxyOp;       \
  struct { int step; } proxyStep;                                                                          \
  struct { uint8_t channelId; uint64_t pTimer; } kernelCh;                                                 \
  struct { int64_t id; void* data; } netPlugin;

typedef struct { uint64_t type; void* parentObj; int rank; union { V5_UNION_MEMBERS }; } descr_v5_t;

/* ---- v6 descriptor: v5 + CE members */
typedef struct {
  uint64_t type; void* parentObj; int rank;
  union {
    V5_UNION_MEMBERS
    struct { uint64_t seqNumber; const char* func; const void* sendBuff; void* recvBuff; size_t count; int root;
             const char* datatype; const char* syncStrategy; bool intraBatchSync; uint32_t batchSize;
             uint32_t numBatches; uint32_t ceSeqNum; void* stream; } ceColl;
    struct { bool isComplete; int nRanks; } ceCollSync;
    struct { int numOps; size_t totalBytes; bool useIntraSync; } ceCollBatch;
  };
} descr_v6_t;

typedef struct { uint8_t type; union { struct { int device; uint64_t wr_id; int opcode; int qpNum; size_t length; } qp; }; } ib_t;
typedef union { struct { size_t transSize; } proxyStep; struct { int appendedProxyOps; } proxyCtrl;
                struct { void* data; } netPlugin; struct { uint64_t pTimer; } kernelCh; } state_args_t;

typedef struct {
  const char* name;
  res_t (*init)(void**, uint64_t, int*, const char*, int, int, int, logger_t);
  res_t (*startEvent)(void*, void**, void*);
  res_t (*stopEvent)(void*);
  res_t (*recordEventState)(void*, int, state_args_t*);
  res_t (*finalize)(void*);
} prof_v5_t;
typedef struct {
  const char* name;
  res_t (*init)(void**, int*, const char*, uint64_t, int, int, int, logger_t);
  res_t (*startEvent)(void*, void**, void*);
  res_t (*stopEvent)(void*);
  res_t (*recordEventState)(void*, int, state_args_t*);
  res_t (*finalize)(void*);
} prof_v4_t;

enum { GROUP = 1, COLL = 2, P2P = 4, PROXY_OP = 8, PROXY_STEP = 16, NET = 128 };
enum { STEP_SEND_WAIT = 9, STEP_RECV_WAIT = 10, NET_UPDATE = 21, PROXY_OP_IN_PROGRESS = 19 };

static int version;
static int failures;

/* Stands in for NCCL's logger: what the plugin logs goes to stdout as `nccl-log: ...`. */
static void harness_log(int level, unsigned long flags, const char* file, int line, const char* fmt, ...) {
  (void)flags; (void)file; (void)line;
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  printf("nccl-log: level=%d %s\n", level, msg);
}
static prof_v4_t* P4;
static prof_v5_t* P5;

#define CHECK(call) do { if ((call) != 0) { fprintf(stderr, "non-zero return: %s\n", #call); failures++; } } while (0)

/* A descriptor big enough for any version, filled through version-specific views. */
typedef union { descr_v4_t v4; descr_v5_t v5; descr_v6_t v6; } any_descr_t;

static void set_head(any_descr_t* d, int type, void* parent, int rank) {
  memset(d, 0xAB, sizeof *d); /* garbage in unused bytes, as on a real stack */
  if (version == 4) { d->v4.type = (uint8_t)type; d->v4.parentObj = parent; d->v4.rank = rank; }
  else { d->v5.type = (uint64_t)type; d->v5.parentObj = parent; d->v5.rank = rank; }
}

static void* start(void* ctx, any_descr_t* d) {
  void* h = NULL;
  if (version == 4) CHECK(P4->startEvent(ctx, &h, d));
  else CHECK(P5->startEvent(ctx, &h, d));
  return h;
}
static void stop(void* h) { if (h) CHECK(version == 4 ? P4->stopEvent(h) : P5->stopEvent(h)); }
static void state(void* h, int s, state_args_t* a) {
  if (h) CHECK(version == 4 ? P4->recordEventState(h, s, a) : P5->recordEventState(h, s, a));
}

static void* group_start(void* ctx, int rank) {
  any_descr_t d; set_head(&d, GROUP, NULL, rank);
  return start(ctx, &d);
}

static void* coll(void* ctx, int rank, void* group, uint64_t seq, const char* func, size_t count, const char* dt,
                  int root, const char* algo, const char* proto, uint8_t nch) {
  any_descr_t d; set_head(&d, COLL, group, rank);
  if (version == 4) {
    d.v4.coll.seqNumber = seq; d.v4.coll.func = func; d.v4.coll.sendBuff = NULL; d.v4.coll.recvBuff = NULL;
    d.v4.coll.count = count; d.v4.coll.root = root; d.v4.coll.datatype = dt; d.v4.coll.nChannels = nch;
    d.v4.coll.nWarps = 16; d.v4.coll.algo = algo; d.v4.coll.proto = proto;
  } else {
    /* v5+: parentObj is the CollApi event (not requested -> NULL); the group is parentGroup */
    d.v5.parentObj = NULL;
    d.v5.coll.seqNumber = seq; d.v5.coll.func = func; d.v5.coll.sendBuff = NULL; d.v5.coll.recvBuff = NULL;
    d.v5.coll.count = count; d.v5.coll.root = root; d.v5.coll.datatype = dt; d.v5.coll.nChannels = nch;
    d.v5.coll.nWarps = 16; d.v5.coll.algo = algo; d.v5.coll.proto = proto; d.v5.coll.parentGroup = group;
  }
  return start(ctx, &d);
}

static void* p2p(void* ctx, int rank, void* group, const char* func, size_t count, const char* dt, int peer) {
  any_descr_t d; set_head(&d, P2P, group, rank);
  if (version == 4) {
    d.v4.p2p.func = func; d.v4.p2p.buff = NULL; d.v4.p2p.datatype = dt; d.v4.p2p.count = count;
    d.v4.p2p.peer = peer; d.v4.p2p.nChannels = 2;
  } else {
    d.v5.parentObj = NULL;
    d.v5.p2p.func = func; d.v5.p2p.buff = NULL; d.v5.p2p.datatype = dt; d.v5.p2p.count = count;
    d.v5.p2p.peer = peer; d.v5.p2p.nChannels = 2; d.v5.p2p.parentGroup = group;
  }
  return start(ctx, &d);
}

static void proxy_with_qp(void* ctx, int rank, void* parent, int channel, int peer, int is_send, int qpn, int dev) {
  any_descr_t d; set_head(&d, PROXY_OP, parent, rank);
  if (version == 4) {
    d.v4.proxyOp.pid = 4242; d.v4.proxyOp.channelId = (uint8_t)channel; d.v4.proxyOp.peer = peer;
    d.v4.proxyOp.nSteps = 4; d.v4.proxyOp.chunkSize = 524288; d.v4.proxyOp.isSend = is_send;
  } else {
    d.v5.proxyOp.pid = 4242; d.v5.proxyOp.channelId = (uint8_t)channel; d.v5.proxyOp.peer = peer;
    d.v5.proxyOp.nSteps = 4; d.v5.proxyOp.chunkSize = 524288; d.v5.proxyOp.isSend = is_send;
  }
  void* op = start(ctx, &d);
  state(op, PROXY_OP_IN_PROGRESS, NULL);
  for (int step = 0; step < 2; step++) {
    set_head(&d, PROXY_STEP, op, rank);
    if (version == 4) d.v4.proxyStep.step = step; else d.v5.proxyStep.step = step;
    void* st = start(ctx, &d);
    state_args_t a = {.proxyStep = {.transSize = 65536}};
    state(st, is_send ? STEP_SEND_WAIT : STEP_RECV_WAIT, &a);
    /* net plugin event: NCCL core hands the IB payload through netPlugin.data */
    ib_t ib; memset(&ib, 0, sizeof ib);
    ib.type = 1; ib.qp.device = dev; ib.qp.wr_id = 77 + (uint64_t)step; ib.qp.opcode = is_send ? 4 : 0;
    ib.qp.qpNum = qpn; ib.qp.length = is_send ? 65536 : 0;
    set_head(&d, NET, st, rank);
    if (version == 4) { d.v4.netPlugin.id = (1 << 16) | 1; d.v4.netPlugin.data = &ib; }
    else { d.v5.netPlugin.id = (1 << 16) | 1; d.v5.netPlugin.data = &ib; }
    void* ne = start(ctx, &d);
    state_args_t na = {.netPlugin = {.data = &ib}};
    state(ne, NET_UPDATE, &na);
    stop(ne);
    stop(st);
  }
  stop(op);
}

static void run_comm(void* ctx, int rank, int flood) {
  void* g = group_start(ctx, rank);
  void* c = coll(ctx, rank, g, 0, "AllReduce", 1024, "ncclFloat32", 0, "RING", "SIMPLE", 2);
  stop(c); /* NCCL stops a coll at enqueue, before its proxy ops start */
  proxy_with_qp(ctx, rank, c, 1, 2, 1, 0x1234, 1);
  proxy_with_qp(ctx, rank, c, 0, 0, 0, 0x2222, 0);
  stop(g);
  g = group_start(ctx, rank);
  stop(coll(ctx, rank, g, 0, "AllGather", 256, "ncclBfloat16", 0, "TREE", "LL128", 1));
  stop(g);
  g = group_start(ctx, rank);
  stop(p2p(ctx, rank, g, "Send", 100, "ncclInt32", 0));
  stop(p2p(ctx, rank, g, "Recv", 50, "ncclInt32", 2));
  stop(p2p(ctx, rank, g, "Send", 10, "ncclInt32", 2));
  stop(g);
  g = group_start(ctx, rank);
  stop(p2p(ctx, rank, g, "Send", 7, "ncclFloat64", 3));
  stop(g);
  stop(coll(ctx, rank, NULL, 0, "Broadcast", 8, "ncclUint8", 2, "RING", "LL", 4));
  for (int i = 0; i < flood; i++) stop(coll(ctx, rank, NULL, 1 + (uint64_t)i, "AllReduce", 4, "ncclFloat32", 0, "RING", "LL", 1));
  /* calls NCCL may make with handles we never gave out */
  stop(NULL);
  any_descr_t d; set_head(&d, 1 << 6, NULL, rank); /* kernelCh: not requested */
  void* k = start(ctx, &d);
  stop(k);
}

static int flood_n;

static void* worker(void* arg) {
  uint64_t id = 0x1000 + (uint64_t)(uintptr_t)arg;
  void* ctx = NULL;
  int mask = 0;
  if (version == 4) CHECK(P4->init(&ctx, &mask, "t", id, 1, 1, 0, NULL));
  else CHECK(P5->init(&ctx, id, &mask, "t", 1, 1, 0, NULL));
  if (mask & COLL)
    for (int i = 0; i < flood_n; i++) stop(coll(ctx, 0, NULL, (uint64_t)i, "AllReduce", (size_t)i, "ncclInt8", 0, "RING", "LL", 1));
  CHECK(version == 4 ? P4->finalize(ctx) : P5->finalize(ctx));
  return NULL;
}

int main(int argc, char** argv) {
  if (argc < 3) { fprintf(stderr, "usage: %s LIB VERSION [FLOOD]\n", argv[0]); return 64; }
  version = atoi(argv[2]);
  int flood = argc > 3 ? atoi(argv[3]) : 0;
  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 3; }
  char sym[32];
  snprintf(sym, sizeof sym, "ncclProfiler_v%d", version);
  void* s = dlsym(lib, sym);
  if (!s) { fprintf(stderr, "dlsym %s: %s\n", sym, dlerror()); return 3; }
  P4 = s; P5 = s;
  int threads = argc > 4 ? atoi(argv[4]) : 0;
  if (threads > 0) {
    pthread_t t[64];
    flood_n = flood;
    for (int i = 0; i < threads && i < 64; i++) pthread_create(&t[i], NULL, worker, (void*)(uintptr_t)i);
    for (int i = 0; i < threads && i < 64; i++) pthread_join(t[i], NULL);
    printf("failures=%d\n", failures);
    return failures ? 2 : 0;
  }
  void *ctx1 = NULL, *ctx2 = NULL;
  int mask1 = -1, mask2 = -1;
  if (version == 4) {
    CHECK(P4->init(&ctx1, &mask1, "world", 0x5ae77eb5ea4ec1eeull, 2, 4, 1, harness_log));
    CHECK(P4->init(&ctx2, &mask2, "pair", 0x42ull, 1, 2, 0, NULL));
  } else {
    CHECK(P5->init(&ctx1, 0x5ae77eb5ea4ec1eeull, &mask1, "world", 2, 4, 1, harness_log));
    CHECK(P5->init(&ctx2, 0x42ull, &mask2, "pair", 1, 2, 0, NULL));
  }
  printf("name=%s mask=%d ctx=%d\n", P5->name, mask1, ctx1 != NULL);
  const char* (*refusal)(uint64_t*) = (const char* (*)(uint64_t*))dlsym(lib, "pulse_nccl_refusal");
  if (refusal) {
    uint64_t n = 0;
    const char* why = refusal(&n);
    printf("refusal=%s count=%llu\n", why ? why : "none", (unsigned long long)n);
  }
  if (mask1 & COLL) run_comm(ctx1, 1, flood);
  if (mask2 & COLL) {
    void* g = group_start(ctx2, 0);
    stop(coll(ctx2, 0, g, 0, "ReduceScatter", 512, "ncclFloat16", 0, "RING", "SIMPLE", 2));
    stop(g);
  }
  CHECK(version == 4 ? P4->finalize(ctx1) : P5->finalize(ctx1));
  CHECK(version == 4 ? P4->finalize(ctx2) : P5->finalize(ctx2));
  /* a communicator created after the others were finalized restarts the writer */
  void* ctx3 = NULL;
  int mask3 = 0;
  if (version == 4) CHECK(P4->init(&ctx3, &mask3, NULL, 0x77ull, 1, 1, 0, NULL));
  else CHECK(P5->init(&ctx3, 0x77ull, &mask3, NULL, 1, 1, 0, NULL));
  if (mask3 & COLL) stop(coll(ctx3, 0, NULL, 0, "AllReduce", 3, "ncclInt64", 0, "TREE", "SIMPLE", 1));
  CHECK(version == 4 ? P4->finalize(ctx3) : P5->finalize(ctx3));
  /* NCCL unloads the plugin once its last communicator is gone */
  if (dlclose(lib) != 0) { fprintf(stderr, "dlclose: %s\n", dlerror()); failures++; }
  printf("failures=%d\n", failures);
  return failures ? 2 : 0;
}
