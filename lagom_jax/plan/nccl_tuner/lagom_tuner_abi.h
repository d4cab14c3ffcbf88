/*
 * Our own declarations of the NCCL tuner plugin interface, versions 3 to 6, so that the
 * plugin builds with a plain C compiler on machines without NCCL headers.
 *
 * Written from the documented ABI (NVIDIA/nccl plugins/tuner/README.md, src/plugin/tuner.cc,
 * checked against NCCL's src/include/plugin/tuner/tuner_v{3,4,5,6}.h and
 * src/include/plugin/nccl_tuner.h). Names carry an lgm_ prefix so that this header never
 * clashes with NCCL's own when both are on an include path; the layouts are NCCL's.
 *
 *   v3  NCCL 2.22-2.23  init(nRanks, nNodes, log, ctx**); getCollInfo edits the cost table
 *   v4  NCCL 2.24-2.27  getCollInfo gains `int regBuff` before nChannels
 *   v5  NCCL 2.28-2.29  init(ctx**, commId, nRanks, nNodes, log, nvlDomainInfo*, constants*);
 *                       destroy renamed finalize (same slot)
 *   v6  NCCL 2.30+      adds getChunkSize after finalize
 */
#ifndef LAGOM_TUNER_ABI_H_
#define LAGOM_TUNER_ABI_H_

#include <stddef.h>
#include <stdint.h>

/* ncclResult_t and ncclFunc_t are C enums, which the SysV ABI passes as int. */
typedef int lgm_result_t;
#define LGM_SUCCESS 0

typedef int lgm_func_t;
#define LGM_FUNC_BROADCAST 0
#define LGM_FUNC_REDUCE 1
#define LGM_FUNC_ALL_GATHER 2
#define LGM_FUNC_REDUCE_SCATTER 3
#define LGM_FUNC_ALL_REDUCE 4
#define LGM_FUNC_ALL_TO_ALL 8 /* ncclFuncAlltoAll, as numbered in NCCL 2.30-era nccl_common.h */

/* Row and column indices of the cost table (NCCL_ALGO_* and NCCL_PROTO_*). */
#define LGM_ALGO_TREE 0
#define LGM_ALGO_RING 1
#define LGM_ALGO_COLLNET_DIRECT 2
#define LGM_ALGO_COLLNET_CHAIN 3
#define LGM_ALGO_NVLS 4
#define LGM_ALGO_NVLS_TREE 5
#define LGM_ALGO_PAT 6
#define LGM_PROTO_LL 0
#define LGM_PROTO_LL128 1
#define LGM_PROTO_SIMPLE 2

/* NCCL_ALGO_PROTO_IGNORE: the cost NCCL gives a combination it cannot run here. */
#define LGM_COST_IGNORE (-1.0f)

/* ncclDebugLogLevel and ncclDebugLogSubSys values used by the plugin. */
#define LGM_LOG_WARN 2
#define LGM_LOG_INFO 3
#define LGM_SUBSYS_TUNING 0x40

typedef void (*lgm_logger_t)(int level, unsigned long flags, const char* file, int line,
                             const char* fmt, ...);

/* ncclNvlDomainInfo_v5_t; v6 uses the same struct. */
typedef struct {
  int nNvlDomains;
  int minRanksPerNvlDomain;
  int maxRanksPerNvlDomain;
} lgm_nvl_domain_info_v5_t;

/* ncclTunerConstants_v5_t (v6: same). The plugin never reads or writes the cost-model
 * constants, so it only needs the pointer type. */
typedef struct lgm_tuner_constants_v5 lgm_tuner_constants_v5_t;

/* The collective cost table is a contiguous float[numAlgo][numProto] that NCCL passes
 * cast to float**; index it as ((float*)table)[algo * numProto + proto]. */

typedef struct {
  const char* name;
  lgm_result_t (*init)(size_t nRanks, size_t nNodes, lgm_logger_t logFunction, void** context);
  lgm_result_t (*getCollInfo)(void* context, lgm_func_t collType, size_t nBytes, int numPipeOps,
                              float** collCostTable, int numAlgo, int numProto, int* nChannels);
  lgm_result_t (*destroy)(void* context);
} lgm_tuner_v3_t;

typedef struct {
  const char* name;
  lgm_result_t (*init)(size_t nRanks, size_t nNodes, lgm_logger_t logFunction, void** context);
  lgm_result_t (*getCollInfo)(void* context, lgm_func_t collType, size_t nBytes, int numPipeOps,
                              float** collCostTable, int numAlgo, int numProto, int regBuff,
                              int* nChannels);
  lgm_result_t (*destroy)(void* context);
} lgm_tuner_v4_t;

typedef struct {
  const char* name;
  lgm_result_t (*init)(void** context, uint64_t commId, size_t nRanks, size_t nNodes,
                       lgm_logger_t logFunction, lgm_nvl_domain_info_v5_t* nvlDomainInfo,
                       lgm_tuner_constants_v5_t* constants);
  lgm_result_t (*getCollInfo)(void* context, lgm_func_t collType, size_t nBytes, int numPipeOps,
                              float** collCostTable, int numAlgo, int numProto, int regBuff,
                              int* nChannels);
  lgm_result_t (*finalize)(void* context);
} lgm_tuner_v5_t;

typedef struct {
  const char* name;
  lgm_result_t (*init)(void** context, uint64_t commId, size_t nRanks, size_t nNodes,
                       lgm_logger_t logFunction, lgm_nvl_domain_info_v5_t* nvlDomainInfo,
                       lgm_tuner_constants_v5_t* constants);
  lgm_result_t (*getCollInfo)(void* context, lgm_func_t collType, size_t nBytes, int numPipeOps,
                              float** collCostTable, int numAlgo, int numProto, int regBuff,
                              int* nChannels);
  lgm_result_t (*finalize)(void* context);
  /* Optional in NCCL (NULL keeps NCCL's chunk). NCCL clamps the result to the buffer's
   * maximum chunk and aligns it to the protocol's grain (src/enqueue.cc calcCollChunking). */
  lgm_result_t (*getChunkSize)(void* context, lgm_func_t collType, size_t nBytes, int algo,
                               int proto, int nChannels, size_t* chunkSize);
} lgm_tuner_v6_t;

#endif /* LAGOM_TUNER_ABI_H_ */
