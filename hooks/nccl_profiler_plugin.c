/* Pulse NCCL profiler plugin: records operator descriptors (coll, p2p, proxy ops, IB QPs)
 * as 64-byte records for the Pulse node agent. Activated only by NCCL_PROFILER_PLUGIN
 * (environment or /etc/nccl.conf).
 *
 * Rules this file keeps, because it runs inside someone else's training job:
 *   - NCCL's threads never block here: records go into a lock-free bounded ring (dropped and
 *     counted when full); a background thread does all I/O.
 *   - Every entry point returns success. Any failure (no memory, sink unusable, thread not
 *     started) disables the plugin for the rest of the process.
 *   - Memory is bounded: one ring and fixed handle pools, allocated once.
 *   - It often runs as root next to other users: the record file is created with O_EXCL and
 *     O_NOFOLLOW under a directory opened O_NOFOLLOW and checked (ours or root's, not writable
 *     by others unless sticky and ours), mode 0600. A refusal disables the plugin and is
 *     counted by reason (pulse_nccl_refusal); the job never sees it.
 *   - Pointers from NCCL are checked before use; handles we hand out are checked to be ours
 *     before they are dereferenced.
 *
 * Build: cc -O2 -fPIC -shared -pthread -o libnccl-profiler-pulse.so nccl_profiler_plugin.c
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "pulse_nccl_abi.h"

#define EXPORT __attribute__((visibility("default")))
#define MAX_CTX 1024
#define OP_POOL 8192        /* coll / p2p / group handles, recycled round-robin */
#define PROXY_POOL 16384    /* proxy-op and proxy-step handles, recycled round-robin */
#define QP_SEEN 4096        /* first-sighting table for QP events */
#define DEFAULT_RING 16384  /* records */
#define MAX_RING (1u << 20)
#define BATCH 63            /* records per datagram after the hello (64 x 64 B = 4 KiB) */

/* ---------------------------------------------------------------- records */
typedef struct {
  uint8_t kind, abi;
  uint16_t flags;
  uint32_t ctx;
  uint64_t t_ns;
  union {
    struct { uint32_t magic, pid, rec_size, format; char host[32]; } hello;
    struct { uint64_t comm_id; int32_t rank, nranks, nnodes, pid; char name[24]; } init;
    struct { uint64_t ordinal, nccl_seq, count; int32_t root;
             uint8_t func, dtype, algo, proto, nch, nwarps, pad[6]; uint64_t group; } coll;
    struct { uint64_t ordinal, group, count; int32_t peer; uint8_t func, dtype, nch, pad[17]; } p2p;
    struct { uint64_t ordinal; int32_t pid, peer, nsteps, chunk; uint8_t channel, is_send, parent_kind,
             pad[21]; } proxy;
    struct { uint64_t ordinal, length; int32_t qpn, device, opcode, peer; uint8_t channel, is_send,
             has_peer, pad[13]; } qp;
    struct { uint64_t comm_id, dropped, handles_dropped, written, sink_errors, pad; } stats;
    unsigned char raw[48];
  };
} rec_t;
_Static_assert(sizeof(((rec_t*)0)->proxy) == 48 && sizeof(((rec_t*)0)->qp) == 48, "payloads are 48 bytes");
_Static_assert(sizeof(rec_t) == PULSE_REC_SIZE, "record must be 64 bytes");

/* ---------------------------------------------------------------- state */
typedef struct {
  _Atomic uint64_t seq;
  rec_t rec;
} cell_t;

typedef struct {
  uint64_t comm_id;
  int rank, nranks, abi;
  uint32_t idx;
  _Atomic uint64_t ordinal;
  _Atomic int live;
} ctx_t;

enum { H_FREE = 0, H_GROUP, H_COLL, H_P2P, H_PROXY_OP, H_PROXY_STEP, H_OTHER };
typedef struct handle {
  _Atomic uint32_t version;   /* seqlock: odd while being written */
  uint8_t kind, channel, is_send, pad;
  uint32_t ctx;
  int32_t peer;
  uint64_t ordinal;           /* coll/p2p: op ordinal; group: group number */
  struct handle* parent;
} handle_t;

static struct {
  _Atomic int disabled;
  pthread_mutex_t lock;
  bool started;
  cell_t* ring;
  uint64_t mask;
  _Atomic uint64_t enq;
  uint64_t deq;
  _Atomic uint64_t dropped, handles_dropped, written, sink_errors;
  _Atomic int stop;
  pthread_t thread;
  int fd;          /* file sink, or -1 */
  int sock;        /* datagram socket sink, or -1 */
  struct sockaddr_un addr;
  socklen_t addrlen;
  char host[64];
  pid_t pid;
  int event_mask;
  bool qp_all;
  _Atomic uint32_t nctx;
  _Atomic int live_ctx;
  _Atomic uint64_t group_no;
  _Atomic uint64_t op_cursor, proxy_cursor;
  ctx_t ctx[MAX_CTX];
  handle_t ops[OP_POOL];
  handle_t proxies[PROXY_POOL];
  handle_t other;  /* shared handle for events we only acknowledge */
  _Atomic uint64_t qp_seen[QP_SEEN];
} G = {.lock = PTHREAD_MUTEX_INITIALIZER, .fd = -1, .sock = -1};

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void disable(void) { atomic_store(&G.disabled, 1); }

/* Why the plugin turned itself off: counted per reason, readable by a supervisor (or a test)
 * through pulse_nccl_refusal() while the library is loaded. */
enum {
  R_NONE = 0, R_DIR_MISSING, R_DIR_OWNER, R_DIR_OPEN_TO_OTHERS, R_FILE_EXISTS, R_FILE_CREATE,
  R_FILE_WRITE, R_SOCKET_PATH, R_SOCKET_DIR, R_RESOURCES, R_COUNT
};
static const char* const REASONS[R_COUNT] = {
    NULL, "record directory missing or not a directory", "record directory owned by another user",
    "record directory writable by others", "record file already exists (not followed)",
    "record file cannot be created", "record file stopped taking writes", "socket path too long",
    "socket directory unsafe", "no memory or thread"};
static _Atomic uint64_t refusals[R_COUNT];
static _Atomic int last_refusal;

static pulse_nccl_logger_t nccl_log; /* NCCL's logger from init, if it gave one */

static void refuse(int reason) {
  atomic_fetch_add(&refusals[reason], 1);
  atomic_store(&last_refusal, reason);
  /* ncclDebugLogLevel WARN = 2, subsystem NCCL_INIT = 1: shown only with NCCL_DEBUG=WARN+. */
  if (nccl_log) nccl_log(2, 1, __FILE__, __LINE__, "Pulse profiler disabled: %s", REASONS[reason]);
}

/* The last reason the plugin disabled itself (NULL if it never did) and how often that
 * reason was counted. */
EXPORT const char* pulse_nccl_refusal(uint64_t* count) {
  int r = atomic_load(&last_refusal);
  if (count) *count = r ? atomic_load(&refusals[r]) : 0;
  return r ? REASONS[r] : NULL;
}

/* ---------------------------------------------------------------- ring (MPSC, Vyukov) */
static void push(const rec_t* r) {
  uint64_t pos = atomic_load_explicit(&G.enq, memory_order_relaxed);
  for (int tries = 0; tries < 64; tries++) {
    cell_t* c = &G.ring[pos & G.mask];
    uint64_t seq = atomic_load_explicit(&c->seq, memory_order_acquire);
    int64_t dif = (int64_t)(seq - pos);
    if (dif == 0) {
      if (atomic_compare_exchange_weak_explicit(&G.enq, &pos, pos + 1, memory_order_relaxed,
                                                memory_order_relaxed)) {
        c->rec = *r;
        atomic_store_explicit(&c->seq, pos + 1, memory_order_release);
        return;
      }
    } else if (dif < 0) {
      break; /* full */
    } else {
      pos = atomic_load_explicit(&G.enq, memory_order_relaxed);
    }
  }
  atomic_fetch_add_explicit(&G.dropped, 1, memory_order_relaxed);
}

static int pop(rec_t* out) {
  cell_t* c = &G.ring[G.deq & G.mask];
  uint64_t seq = atomic_load_explicit(&c->seq, memory_order_acquire);
  if (seq != G.deq + 1) return 0;
  *out = c->rec;
  atomic_store_explicit(&c->seq, G.deq + G.mask + 1, memory_order_release);
  G.deq++;
  return 1;
}

/* ---------------------------------------------------------------- sink + flusher */
static void fill_hello(rec_t* r) {
  memset(r, 0, sizeof *r);
  r->kind = PULSE_REC_HELLO;
  r->t_ns = now_ns();
  r->hello.magic = PULSE_REC_MAGIC;
  r->hello.pid = (uint32_t)G.pid;
  r->hello.rec_size = PULSE_REC_SIZE;
  r->hello.format = PULSE_REC_FORMAT;
  strncpy(r->hello.host, G.host, sizeof r->hello.host - 1);
}

static int write_all(int fd, const void* buf, size_t n) {
  const char* p = buf;
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

static void emit(rec_t* buf, int n) { /* buf[0] is reserved for the hello */
  if (G.sock >= 0) {
    fill_hello(&buf[0]);
    ssize_t w = sendto(G.sock, buf, (size_t)(n + 1) * sizeof(rec_t), MSG_DONTWAIT | MSG_NOSIGNAL,
                       (struct sockaddr*)&G.addr, G.addrlen);
    if (w < 0) { /* no reader, reader too slow: the agent may come later, keep going */
      atomic_fetch_add(&G.sink_errors, 1);
      atomic_fetch_add(&G.dropped, (uint64_t)n);
      return;
    }
  } else if (G.fd >= 0) {
    if (write_all(G.fd, &buf[1], (size_t)n * sizeof(rec_t)) != 0) {
      atomic_fetch_add(&G.sink_errors, 1);
      atomic_fetch_add(&G.dropped, (uint64_t)n);
      refuse(R_FILE_WRITE);
      disable(); /* a file that stops taking writes will not recover by itself */
      return;
    }
  }
  atomic_fetch_add(&G.written, (uint64_t)n);
}

static int drain(void) {
  rec_t buf[BATCH + 1];
  int n = 0, total = 0;
  while (n < BATCH && pop(&buf[n + 1])) n++;
  while (n > 0) {
    emit(buf, n);
    total += n;
    n = 0;
    while (n < BATCH && pop(&buf[n + 1])) n++;
  }
  return total;
}

static void* flusher(void* arg) {
  (void)arg;
  struct timespec nap = {0, 5 * 1000 * 1000};
  while (!atomic_load(&G.stop)) {
    if (drain() == 0) nanosleep(&nap, NULL);
  }
  drain();
  return NULL;
}

/* A directory Pulse may create files in: ours or root's, and not writable by others unless
 * it is sticky and ours (then nobody else can rename or unlink our files in it). Returns the
 * reason to refuse it, or R_NONE. */
static int check_dir(const struct stat* st) {
  if (!S_ISDIR(st->st_mode)) return R_DIR_MISSING;
  uid_t me = geteuid();
  if (st->st_uid != me && st->st_uid != 0) return R_DIR_OWNER;
  if ((st->st_mode & (S_IWGRP | S_IWOTH)) && !((st->st_mode & S_ISVTX) && st->st_uid == me))
    return R_DIR_OPEN_TO_OTHERS;
  return R_NONE;
}

/* The default record directory: $XDG_RUNTIME_DIR/pulse (a per-user tmpfs) or /run/pulse,
 * created 0700 when missing. */
static int default_dir(char* out, size_t n) {
  const char* base = getenv("XDG_RUNTIME_DIR");
  if (!base || base[0] != '/') base = "/run";
  int len = snprintf(out, n, "%s/pulse", base);
  if (len <= 0 || (size_t)len >= n) return -1;
  if (mkdir(out, 0700) != 0 && errno != EEXIST) return -1;
  return 0;
}

static int open_sink(void) {
  const char* sock = getenv("PULSE_HOOK_SOCKET");
  if (sock && *sock) {
    if (strlen(sock) >= sizeof G.addr.sun_path) { refuse(R_SOCKET_PATH); return -1; }
    /* Our records tell who talks to whom: only send them where nobody else could have
     * bound the socket (its directory passes the same checks as a record directory). */
    char parent[sizeof G.addr.sun_path];
    strcpy(parent, sock);
    char* slash = strrchr(parent, '/');
    if (slash == parent) parent[1] = 0;
    else if (slash) *slash = 0;
    else strcpy(parent, ".");
    struct stat st;
    if (stat(parent, &st) != 0 || check_dir(&st) != R_NONE) { refuse(R_SOCKET_DIR); return -1; }
    G.sock = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (G.sock < 0) { refuse(R_RESOURCES); return -1; }
    memset(&G.addr, 0, sizeof G.addr);
    G.addr.sun_family = AF_UNIX;
    strcpy(G.addr.sun_path, sock);
    G.addrlen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + strlen(sock) + 1);
    return 0;
  }
  if (G.fd >= 0) return 0; /* a restarted writer appends to the file this process created */
  char dbuf[4096];
  const char* dir = getenv("PULSE_HOOK_DIR");
  if (!dir || !*dir) {
    if (default_dir(dbuf, sizeof dbuf) != 0) { refuse(R_DIR_MISSING); return -1; }
    dir = dbuf;
  }
  int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (dfd < 0) { refuse(R_DIR_MISSING); return -1; }
  struct stat st;
  int why = fstat(dfd, &st) != 0 ? R_DIR_MISSING : check_dir(&st);
  if (why != R_NONE) { close(dfd); refuse(why); return -1; }
  char name[256];
  int len = snprintf(name, sizeof name, "pulse-nccl-%s-%d.rec", G.host, (int)G.pid);
  if (len <= 0 || (size_t)len >= sizeof name) { close(dfd); refuse(R_FILE_CREATE); return -1; }
  /* O_EXCL: never an existing file, O_NOFOLLOW: never through a planted symlink. */
  G.fd = openat(dfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_APPEND | O_CLOEXEC, 0600);
  int err = errno;
  close(dfd);
  if (G.fd < 0) { refuse(err == EEXIST || err == ELOOP ? R_FILE_EXISTS : R_FILE_CREATE); return -1; }
  rec_t hello;
  fill_hello(&hello);
  if (write_all(G.fd, &hello, sizeof hello) != 0) {
    close(G.fd);
    G.fd = -1;
    refuse(R_FILE_WRITE);
    return -1;
  }
  return 0;
}

static int env_int(const char* name, int dflt) {
  const char* v = getenv(name);
  if (!v || !*v) return dflt;
  char* end = NULL;
  long x = strtol(v, &end, 0);
  return (end && *end == 0) ? (int)x : dflt;
}

/* A forked child has the ring but not the writer thread: it records nothing. */
static void in_forked_child(void) { disable(); }

/* Called under G.lock. Returns 0 when recording can start. */
static int start_locked(void) {
  if (G.started) return 0;
  G.pid = getpid();
  const char* node = getenv("PULSE_NODE");
  if (node && *node) {
    strncpy(G.host, node, sizeof G.host - 1);
  } else if (gethostname(G.host, sizeof G.host - 1) != 0) {
    strcpy(G.host, "unknown");
  }
  for (char* p = G.host; *p; p++)
    if (*p == '/' || *p == ' ') *p = '_';
  G.event_mask = env_int("PULSE_NCCL_EVENT_MASK", PULSE_EV_GROUP | PULSE_EV_COLL | PULSE_EV_P2P |
                                                      PULSE_EV_PROXY_OP | PULSE_EV_PROXY_STEP |
                                                      PULSE_EV_NET_PLUGIN);
  G.qp_all = env_int("PULSE_NCCL_QP_ALL", 0) != 0;
  uint64_t want = (uint64_t)env_int("PULSE_NCCL_RING", DEFAULT_RING), cap = 64;
  while (cap < want && cap < MAX_RING) cap <<= 1;
  if (!G.ring) { /* once per process: a restarted flusher keeps the ring and its position */
    G.ring = calloc(cap, sizeof(cell_t));
    if (!G.ring) { refuse(R_RESOURCES); return -1; }
    G.mask = cap - 1;
    for (uint64_t i = 0; i < cap; i++) atomic_store(&G.ring[i].seq, i);
  }
  if (open_sink() != 0) return -1;
  /* The flusher must not take the job's signals. */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int rc = pthread_create(&G.thread, NULL, flusher, NULL);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (rc != 0) { refuse(R_RESOURCES); return -1; }
  G.other.kind = H_OTHER;
  G.started = true;
  static bool atfork_set = false;
  if (!atfork_set) atfork_set = pthread_atfork(NULL, NULL, in_forked_child) == 0;
  return 0;
}

/* Returns false when the writer thread could not be joined (it may still touch the ring).
 * The record file stays open unless the library is unloading: it was created O_EXCL, so a
 * writer restarted by a later communicator keeps appending to it. */
static bool stop_locked(bool unloading) {
  if (!G.started) return true;
  atomic_store(&G.stop, 1);
  struct timespec deadline;
  clock_gettime(CLOCK_REALTIME, &deadline);
  deadline.tv_sec += 2;
  bool joined = pthread_timedjoin_np(G.thread, NULL, &deadline) == 0;
  if (!joined) pthread_detach(G.thread);
  if (G.fd >= 0 && unloading) {
    close(G.fd);
    G.fd = -1;
  }
  if (G.sock >= 0) close(G.sock);
  G.sock = -1;
  G.started = false;
  atomic_store(&G.stop, 0);
  /* The ring stays allocated: a late call from another thread may still push into it. */
  return joined;
}

/* On dlclose or exit: flush what is queued and stop the writer. At exit() other threads
 * (NCCL's proxy) may still call in, so new records are refused and the ring is not freed. */
__attribute__((destructor)) static void at_unload(void) {
  disable();
  if (pthread_mutex_trylock(&G.lock) != 0) return;
  stop_locked(true);
  pthread_mutex_unlock(&G.lock);
}

/* ---------------------------------------------------------------- name codes */
/* Codes shared with pulse.hooks.plugin_reader (FUNCS, DTYPES, ALGOS, PROTOS there). */
static const char* FUNCS[] = {"AllReduce", "AllGather", "ReduceScatter", "Broadcast", "Reduce",
                              "Send", "Recv", "AlltoAll", "Gather", "Scatter", "SendRecv", NULL};
static const char* DTYPES[] = {"int8", "uint8", "int32", "uint32", "int64", "uint64", "float16",
                               "float32", "float64", "bfloat16", "float8e4m3", "float8e5m2", NULL};
static const char* DTYPE_ALIASES[][2] = {{"char", "int8"}, {"int", "int32"}, {"half", "float16"},
                                         {"float", "float32"}, {"double", "float64"},
                                         {"fp8e4m3", "float8e4m3"}, {"fp8e5m2", "float8e5m2"},
                                         {NULL, NULL}};
/* NCCL's ncclAlgoToString / ncclProtoToString spellings (compared case-insensitively). */
static const char* ALGOS[] = {"tree", "ring", "collnet_direct", "collnet_chain", "nvls", "nvls_tree",
                              "pat", NULL};
static const char* PROTOS[] = {"ll", "ll128", "simple", NULL};

static uint8_t code_of(const char* s, const char** table, const char* (*aliases)[2]) {
  if (!s) return 255;
  if (strncasecmp(s, "nccl", 4) == 0) s += 4;
  for (int i = 0; table[i]; i++)
    if (strcasecmp(s, table[i]) == 0) return (uint8_t)i;
  if (aliases)
    for (int i = 0; aliases[i][0]; i++)
      if (strcasecmp(s, aliases[i][0]) == 0) return code_of(aliases[i][1], table, NULL);
  return 255;
}

/* ---------------------------------------------------------------- handles */
static handle_t* handle_alloc(handle_t* pool, size_t n, _Atomic uint64_t* cursor) {
  uint64_t i = atomic_fetch_add_explicit(cursor, 1, memory_order_relaxed);
  handle_t* h = &pool[i % n];
  atomic_fetch_add_explicit(&h->version, 1, memory_order_acq_rel); /* odd: writing */
  return h;
}

static void handle_publish(handle_t* h) {
  atomic_fetch_add_explicit(&h->version, 1, memory_order_release);
}

static bool in_pool(const void* p, const handle_t* pool, size_t n) {
  uintptr_t a = (uintptr_t)p, lo = (uintptr_t)pool, hi = (uintptr_t)(pool + n);
  return a >= lo && a < hi && (a - lo) % sizeof(handle_t) == 0;
}

static bool ours(const void* p) {
  return in_pool(p, G.ops, OP_POOL) || in_pool(p, G.proxies, PROXY_POOL);
}

/* Consistent copy of a handle that may be recycled concurrently; false if it keeps moving. */
static bool handle_read(const void* p, handle_t* out) {
  if (!p || !ours(p)) return false;
  handle_t* h = (handle_t*)p;
  for (int tries = 0; tries < 4; tries++) {
    uint32_t v0 = atomic_load_explicit(&h->version, memory_order_acquire);
    if (v0 & 1u) continue;
    out->kind = h->kind;
    out->channel = h->channel;
    out->is_send = h->is_send;
    out->ctx = h->ctx;
    out->peer = h->peer;
    out->ordinal = h->ordinal;
    out->parent = h->parent;
    atomic_thread_fence(memory_order_acquire);
    if (atomic_load_explicit(&h->version, memory_order_relaxed) == v0) return true;
  }
  return false;
}

static ctx_t* ctx_of(void* context) {
  ctx_t* c = context;
  if (!c || (uintptr_t)c < (uintptr_t)G.ctx || (uintptr_t)c >= (uintptr_t)(G.ctx + MAX_CTX)) return NULL;
  return c;
}

static void rec_head(rec_t* r, uint8_t kind, const ctx_t* c) {
  memset(r, 0, sizeof *r);
  r->kind = kind;
  r->abi = (uint8_t)c->abi;
  r->ctx = c->idx;
  r->t_ns = now_ns();
}

/* ---------------------------------------------------------------- the API */
static pulse_nccl_result_t do_init(int abi, void** context, uint64_t comm_id, int* mask,
                                   const char* name, int nnodes, int nranks, int rank,
                                   pulse_nccl_logger_t logfn) {
  if (context) *context = NULL;
  if (mask) *mask = 0;
  if (!context || !mask || atomic_load(&G.disabled)) return PULSE_NCCL_SUCCESS;
  pthread_mutex_lock(&G.lock);
  if (logfn) nccl_log = logfn;
  if (start_locked() != 0) {
    disable();
    pthread_mutex_unlock(&G.lock);
    return PULSE_NCCL_SUCCESS;
  }
  uint32_t idx = atomic_fetch_add(&G.nctx, 1);
  if (idx >= MAX_CTX) { /* too many comms: record none for this one */
    pthread_mutex_unlock(&G.lock);
    return PULSE_NCCL_SUCCESS;
  }
  /* Counted under the lock, so a concurrent last finalize cannot stop the writer after we
   * decided it runs. */
  atomic_fetch_add(&G.live_ctx, 1);
  pthread_mutex_unlock(&G.lock);
  ctx_t* c = &G.ctx[idx];
  c->comm_id = comm_id;
  c->rank = rank;
  c->nranks = nranks;
  c->abi = abi;
  c->idx = idx + 1;
  atomic_store(&c->ordinal, 0);
  atomic_store(&c->live, 1);
  rec_t r;
  rec_head(&r, PULSE_REC_INIT, c);
  r.init.comm_id = comm_id;
  r.init.rank = rank;
  r.init.nranks = nranks;
  r.init.nnodes = nnodes;
  r.init.pid = (int32_t)G.pid;
  if (name) strncpy(r.init.name, name, sizeof r.init.name - 1);
  push(&r);
  *context = c;
  *mask = G.event_mask;
  return PULSE_NCCL_SUCCESS;
}

static pulse_nccl_result_t init_v5(void** context, uint64_t comm_id, int* mask, const char* name,
                                   int nnodes, int nranks, int rank, pulse_nccl_logger_t logfn) {
  return do_init(5, context, comm_id, mask, name, nnodes, nranks, rank, logfn);
}

static pulse_nccl_result_t init_v6(void** context, uint64_t comm_id, int* mask, const char* name,
                                   int nnodes, int nranks, int rank, pulse_nccl_logger_t logfn) {
  return do_init(6, context, comm_id, mask, name, nnodes, nranks, rank, logfn);
}

static pulse_nccl_result_t init_v4(void** context, int* mask, const char* name, uint64_t comm_hash,
                                   int nnodes, int nranks, int rank, pulse_nccl_logger_t logfn) {
  return do_init(4, context, comm_hash, mask, name, nnodes, nranks, rank, logfn);
}

static uint64_t group_of(const pulse_event_descr_t* d, const void* legacy_parent, int abi) {
  const void* g = (abi >= 5 && legacy_parent) ? legacy_parent : d->parentObj;
  handle_t h;
  if (handle_read(g, &h) && h.kind == H_GROUP) return h.ordinal;
  return 0;
}

static void start_net(ctx_t* c, const pulse_event_descr_t* d) {
  int64_t id = d->netPlugin.id;
  if (((uint64_t)id & 0xffff0000u) != PULSE_NET_TYPE_IB || (id & 0xffff) != PULSE_NET_IB_VERSION) return;
  const pulse_net_ib_descr_t* ib = d->netPlugin.data;
  if (!ib || !(ib->type & PULSE_NET_IB_QP_EVENT)) return;
  rec_t r;
  rec_head(&r, PULSE_REC_NET_QP, c);
  r.qp.qpn = ib->qp.qpNum;
  r.qp.device = ib->qp.device;
  r.qp.opcode = ib->qp.opcode;
  r.qp.length = ib->qp.length;
  handle_t step, op;
  if (handle_read(d->parentObj, &step) && step.kind == H_PROXY_STEP && handle_read(step.parent, &op) &&
      op.kind == H_PROXY_OP) {
    r.qp.peer = op.peer;
    r.qp.channel = op.channel;
    r.qp.is_send = op.is_send;
    r.qp.ordinal = op.ordinal;
    r.qp.has_peer = 1;
  } else {
    r.qp.is_send = 255;
  }
  if (!G.qp_all) { /* first sighting of (device, qpn, peer, channel, direction) only */
    uint64_t key = ((uint64_t)(uint32_t)r.qp.qpn) | ((uint64_t)(r.qp.device & 0xff) << 24) |
                   ((uint64_t)(r.qp.peer & 0xfffff) << 32) | ((uint64_t)r.qp.channel << 52) |
                   ((uint64_t)(r.qp.is_send & 1) << 62) | (1ull << 63);
    uint64_t slot = (key * 0x9E3779B97F4A7C15ull) >> 52; /* 12 bits = QP_SEEN */
    for (int probe = 0; probe < 16; probe++) {
      _Atomic uint64_t* s = &G.qp_seen[(slot + (uint64_t)probe) % QP_SEEN];
      uint64_t cur = atomic_load_explicit(s, memory_order_relaxed);
      if (cur == key) return;
      if (cur == 0) {
        if (atomic_compare_exchange_strong(s, &cur, key)) break;
        if (cur == key) return;
      }
    }
  }
  push(&r);
}

static pulse_nccl_result_t start_event(void* context, void** eHandle, pulse_event_descr_t* d) {
  if (eHandle) *eHandle = NULL;
  if (!eHandle || !d || atomic_load_explicit(&G.disabled, memory_order_relaxed)) return PULSE_NCCL_SUCCESS;
  ctx_t* c = ctx_of(context);
  if (!c) return PULSE_NCCL_SUCCESS;
  uint64_t type = c->abi == 4 ? (uint64_t)*(const uint8_t*)d : d->type;
  rec_t r;
  handle_t* h;
  switch (type) {
    case PULSE_EV_GROUP:
      h = handle_alloc(G.ops, OP_POOL, &G.op_cursor);
      h->kind = H_GROUP;
      h->ctx = c->idx;
      h->ordinal = atomic_fetch_add(&G.group_no, 1) + 1;
      h->parent = NULL;
      handle_publish(h);
      *eHandle = h;
      break;
    case PULSE_EV_COLL: {
      uint64_t ord = atomic_fetch_add(&c->ordinal, 1);
      rec_head(&r, PULSE_REC_COLL, c);
      r.coll.ordinal = ord;
      r.coll.nccl_seq = d->coll.seqNumber;
      r.coll.count = d->coll.count;
      r.coll.root = d->coll.root;
      r.coll.func = code_of(d->coll.func, FUNCS, NULL);
      r.coll.dtype = code_of(d->coll.datatype, DTYPES, DTYPE_ALIASES);
      r.coll.algo = code_of(d->coll.algo, ALGOS, NULL);
      r.coll.proto = code_of(d->coll.proto, PROTOS, NULL);
      r.coll.nch = d->coll.nChannels;
      r.coll.nwarps = d->coll.nWarps;
      r.coll.group = group_of(d, c->abi >= 5 ? d->coll.parentGroup : NULL, c->abi);
      push(&r);
      h = handle_alloc(G.ops, OP_POOL, &G.op_cursor);
      h->kind = H_COLL;
      h->ctx = c->idx;
      h->ordinal = ord;
      h->parent = NULL;
      handle_publish(h);
      *eHandle = h;
      break;
    }
    case PULSE_EV_P2P: {
      uint64_t ord = atomic_fetch_add(&c->ordinal, 1);
      rec_head(&r, PULSE_REC_P2P, c);
      r.p2p.ordinal = ord;
      r.p2p.count = d->p2p.count;
      r.p2p.peer = d->p2p.peer;
      r.p2p.func = code_of(d->p2p.func, FUNCS, NULL);
      r.p2p.dtype = code_of(d->p2p.datatype, DTYPES, DTYPE_ALIASES);
      r.p2p.nch = d->p2p.nChannels;
      r.p2p.group = group_of(d, c->abi >= 5 ? d->p2p.parentGroup : NULL, c->abi);
      push(&r);
      h = handle_alloc(G.ops, OP_POOL, &G.op_cursor);
      h->kind = H_P2P;
      h->ctx = c->idx;
      h->ordinal = ord;
      h->peer = d->p2p.peer;
      h->parent = NULL;
      handle_publish(h);
      *eHandle = h;
      break;
    }
    case PULSE_EV_PROXY_OP: {
      handle_t parent;
      bool have = handle_read(d->parentObj, &parent) && (parent.kind == H_COLL || parent.kind == H_P2P);
      rec_head(&r, PULSE_REC_PROXY_OP, c);
      r.proxy.ordinal = have ? parent.ordinal : UINT64_MAX;
      r.proxy.parent_kind = have ? parent.kind : 0;
      r.proxy.pid = (int32_t)d->proxyOp.pid;
      r.proxy.peer = d->proxyOp.peer;
      r.proxy.nsteps = d->proxyOp.nSteps;
      r.proxy.chunk = d->proxyOp.chunkSize;
      r.proxy.channel = d->proxyOp.channelId;
      r.proxy.is_send = d->proxyOp.isSend != 0;
      push(&r);
      h = handle_alloc(G.proxies, PROXY_POOL, &G.proxy_cursor);
      h->kind = H_PROXY_OP;
      h->ctx = c->idx;
      h->ordinal = r.proxy.ordinal;
      h->peer = d->proxyOp.peer;
      h->channel = d->proxyOp.channelId;
      h->is_send = d->proxyOp.isSend != 0;
      h->parent = NULL;
      handle_publish(h);
      *eHandle = h;
      break;
    }
    case PULSE_EV_PROXY_STEP:
      h = handle_alloc(G.proxies, PROXY_POOL, &G.proxy_cursor);
      h->kind = H_PROXY_STEP;
      h->ctx = c->idx;
      h->parent = ours(d->parentObj) ? d->parentObj : NULL;
      handle_publish(h);
      *eHandle = h;
      break;
    case PULSE_EV_NET_PLUGIN:
      start_net(c, d);
      *eHandle = &G.other;
      break;
    default:
      break; /* not requested by us: no handle, NCCL skips the rest of its life cycle */
  }
  return PULSE_NCCL_SUCCESS;
}

static pulse_nccl_result_t stop_event(void* eHandle) {
  (void)eHandle; /* handles are recycled round-robin: nothing to release */
  return PULSE_NCCL_SUCCESS;
}

static pulse_nccl_result_t record_state(void* eHandle, pulse_event_state_t state,
                                        pulse_event_state_args_t* args) {
  (void)eHandle;
  (void)state;
  (void)args;
  return PULSE_NCCL_SUCCESS;
}

static pulse_nccl_result_t finalize(void* context) {
  ctx_t* c = ctx_of(context);
  if (!c || !atomic_exchange(&c->live, 0)) return PULSE_NCCL_SUCCESS;
  rec_t r;
  rec_head(&r, PULSE_REC_FINI, c);
  r.stats.comm_id = c->comm_id;
  r.stats.dropped = atomic_load(&G.dropped);
  r.stats.handles_dropped = atomic_load(&G.handles_dropped);
  r.stats.written = atomic_load(&G.written);
  r.stats.sink_errors = atomic_load(&G.sink_errors);
  if (!atomic_load(&G.disabled)) push(&r);
  if (atomic_fetch_sub(&G.live_ctx, 1) == 1) { /* last comm: flush and stop the thread */
    pthread_mutex_lock(&G.lock);
    if (atomic_load(&G.live_ctx) == 0) stop_locked(false);
    pthread_mutex_unlock(&G.lock);
  }
  return PULSE_NCCL_SUCCESS;
}

/* The loader looks these data symbols up by name, newest first (v6, v5, v4, ...). */
EXPORT const pulse_profiler_v5_t ncclProfiler_v6 = {"Pulse", init_v6, start_event, stop_event,
                                                    record_state, finalize};
EXPORT const pulse_profiler_v5_t ncclProfiler_v5 = {"Pulse", init_v5, start_event, stop_event,
                                                    record_state, finalize};
EXPORT const pulse_profiler_v4_t ncclProfiler_v4 = {"Pulse", init_v4, start_event, stop_event,
                                                    record_state, finalize};
