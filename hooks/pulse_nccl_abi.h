/* The parts of NCCL's profiler-plugin ABI that Pulse uses, written for Pulse from the layout
 * facts in shared/reference/hooks-and-formats.md section 1 (not NCCL's header).
 *
 * Only the union members Pulse reads are spelled out; the descriptors are read through
 * pointers NCCL owns, so what matters is that every member we read sits at NCCL's offset:
 *   - v4 starts with a uint8_t type, v5/v6 with a uint64_t type. On little-endian hosts the
 *     low byte sits at offset 0 in both, and parentObj/rank/union follow at the same offsets
 *     (8, 16, 24) because the pointer after `type` is 8-byte aligned.
 *   - v5 appends parentGroup to coll and p2p; v6 adds CE members to the union only.
 */
#ifndef PULSE_NCCL_ABI_H
#define PULSE_NCCL_ABI_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef int pulse_nccl_result_t; /* ncclResult_t is an int-sized enum; 0 = ncclSuccess */
#define PULSE_NCCL_SUCCESS 0

/* ncclDebugLogger_t: NCCL passes its logger; Pulse calls it once, at WARN level, when it
 * disables itself (the reason; see pulse_nccl_refusal). */
typedef void (*pulse_nccl_logger_t)(int level, unsigned long flags, const char* file, int line,
                                    const char* fmt, ...);

/* Event type bits (activation mask and descriptor `type`). */
enum {
  PULSE_EV_GROUP = 1 << 0,
  PULSE_EV_COLL = 1 << 1,
  PULSE_EV_P2P = 1 << 2,
  PULSE_EV_PROXY_OP = 1 << 3,
  PULSE_EV_PROXY_STEP = 1 << 4,
  PULSE_EV_PROXY_CTRL = 1 << 5,
  PULSE_EV_KERNEL_CH = 1 << 6,
  PULSE_EV_NET_PLUGIN = 1 << 7,
  PULSE_EV_GROUP_API = 1 << 8,
  PULSE_EV_COLL_API = 1 << 9,
  PULSE_EV_P2P_API = 1 << 10,
  PULSE_EV_KERNEL_LAUNCH = 1 << 11,
};

/* Net-plugin event ids: type in bits 16.., payload version in the low 16 bits. */
#define PULSE_NET_TYPE_IB (1u << 16)
#define PULSE_NET_TYPE_SOCK (2u << 16)
#define PULSE_NET_IB_VERSION 1
#define PULSE_NET_IB_QP_EVENT (1 << 0)

typedef struct {
  const char* func;
  void* buff;
  const char* datatype;
  size_t count;
  int peer;
  uint8_t nChannels;
  void* parentGroup; /* v5/v6 only */
} pulse_p2p_desc_t;

typedef struct {
  uint64_t seqNumber;
  const char* func;
  const void* sendBuff;
  void* recvBuff;
  size_t count;
  int root;
  const char* datatype;
  uint8_t nChannels;
  uint8_t nWarps;
  const char* algo;
  const char* proto;
  void* parentGroup; /* v5/v6 only */
} pulse_coll_desc_t;

typedef struct {
  pid_t pid;
  uint8_t channelId;
  int peer;
  int nSteps;
  int chunkSize;
  int isSend;
} pulse_proxy_op_desc_t;

typedef struct {
  int64_t id;
  void* data;
} pulse_net_plugin_desc_t;

/* v5/v6 layout; v4 is read through the same struct (see the note at the top), never
 * touching parentGroup. The trailing pad keeps sizeof >= NCCL's own descriptor size so a
 * harness allocating this struct gives NCCL-sized storage. */
typedef struct {
  uint64_t type;
  void* parentObj;
  int rank;
  union {
    pulse_coll_desc_t coll;
    pulse_p2p_desc_t p2p;
    pulse_proxy_op_desc_t proxyOp;
    struct { int step; } proxyStep;
    pulse_net_plugin_desc_t netPlugin;
    unsigned char pad_[128];
  };
} pulse_event_descr_t;

/* Payload of an IB net-plugin event (net_ib v1). */
typedef struct {
  uint8_t type;
  union {
    struct {
      int device;
      uint64_t wr_id;
      int opcode;
      int qpNum;
      size_t length;
    } qp;
  };
} pulse_net_ib_descr_t;

typedef int pulse_event_state_t; /* enum, int-sized */
typedef union {
  struct { size_t transSize; } proxyStep;
  struct { int appendedProxyOps; } proxyCtrl;
  struct { void* data; } netPlugin;
  struct { uint64_t pTimer; } kernelCh;
} pulse_event_state_args_t;

/* The exported symbols: structs of function pointers. */
typedef struct {
  const char* name;
  pulse_nccl_result_t (*init)(void** context, uint64_t commId, int* eActivationMask,
                              const char* commName, int nNodes, int nranks, int rank,
                              pulse_nccl_logger_t logfn);
  pulse_nccl_result_t (*startEvent)(void* context, void** eHandle, pulse_event_descr_t* eDescr);
  pulse_nccl_result_t (*stopEvent)(void* eHandle);
  pulse_nccl_result_t (*recordEventState)(void* eHandle, pulse_event_state_t eState,
                                          pulse_event_state_args_t* eStateArgs);
  pulse_nccl_result_t (*finalize)(void* context);
} pulse_profiler_v5_t; /* v6 has the same signatures */

typedef struct {
  const char* name;
  /* v4: mask before the comm name, commHash fourth (differs from v5!) */
  pulse_nccl_result_t (*init)(void** context, int* eActivationMask, const char* commName,
                              uint64_t commHash, int nNodes, int nranks, int rank,
                              pulse_nccl_logger_t logfn);
  pulse_nccl_result_t (*startEvent)(void* context, void** eHandle, pulse_event_descr_t* eDescr);
  pulse_nccl_result_t (*stopEvent)(void* eHandle);
  pulse_nccl_result_t (*recordEventState)(void* eHandle, pulse_event_state_t eState,
                                          pulse_event_state_args_t* eStateArgs);
  pulse_nccl_result_t (*finalize)(void* context);
} pulse_profiler_v4_t;

/* ---- Pulse's record format (64 bytes each, host byte order = little-endian) ---------- */
#define PULSE_REC_SIZE 64
#define PULSE_REC_MAGIC 0x31534c50u /* "PLS1" */
#define PULSE_REC_FORMAT 1

enum {
  PULSE_REC_HELLO = 1,  /* first record of a file and of every datagram */
  PULSE_REC_INIT = 2,
  PULSE_REC_COLL = 3,
  PULSE_REC_P2P = 4,
  PULSE_REC_PROXY_OP = 5,
  PULSE_REC_NET_QP = 6,
  PULSE_REC_FINI = 7,
  PULSE_REC_STATS = 8,
};

#endif
