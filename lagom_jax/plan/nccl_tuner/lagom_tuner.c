/*
 * lagom-jax NCCL tuner plugin: applies per-collective algorithm, protocol, channel count and
 * chunk size from a lagom tuner config file (format: config.py in this directory, README.md).
 *
 * NCCL loads the plugin named by NCCL_TUNER_PLUGIN and asks it, for every collective call,
 * to adjust NCCL's own choice. The file named by LAGOM_TUNER_CONFIG is read once per
 * communicator at init; the rules that can apply to that communicator's ranks and nodes are
 * copied into its context, which is never written afterwards. Calls therefore share no
 * mutable state, so any number of threads may call getCollInfo/getChunkSize at once.
 *
 * A call that no rule matches leaves everything as NCCL chose it: the cost table untouched,
 * *nChannels left at 0 (NCCL's "use your own count"), the chunk size unchanged. A rule
 * applies all or nothing: when NCCL cannot run the rule's algorithm/protocol here (its
 * cost-table entry is NCCL_ALGO_PROTO_IGNORE) the rule's channel count is not applied either,
 * and its chunk size is only applied when NCCL runs the rule's algorithm and protocol.
 *
 * Config problems never fail the process: a missing or unreadable file, a wrong header or a
 * malformed line is reported (through NCCL's logger when NCCL gives one, else on stderr) with
 * the file's path and line number, and only the bad part is ignored.
 *
 * Build: cc -shared -fPIC -O2 lagom_tuner.c -o libnccl-tuner-lagom.so   (no NCCL needed)
 */
#define _POSIX_C_SOURCE 200809L

#include "lagom_tuner_abi.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LGM_EXPORT __attribute__((visibility("default")))

#define CONFIG_ENV "LAGOM_TUNER_CONFIG"
#define CONFIG_HEADER "# lagom-tuner-config v1"
#define NFIELDS 9
#define ANY (-1)
/* MAXCHANNELS in NCCL (NVIDIA/nccl src/include/device.h). */
#define MAX_CHANNELS 64
/* Tokens longer than this are shortened in messages; config.py does the same. */
#define SHOWN_CHARS 40

typedef struct {
  int kind;              /* lgm_func_t or ANY */
  uint64_t min_bytes;    /* inclusive */
  uint64_t max_bytes;    /* exclusive; only meaningful when bounded */
  int bounded;           /* 0 when max_bytes is '*' */
  uint64_t nranks;       /* 0 = any */
  uint64_t nnodes;       /* 0 = any */
  int algo;              /* LGM_ALGO_* or ANY (keep NCCL's algorithm and protocol) */
  int proto;             /* LGM_PROTO_* or ANY */
  int nchannels;         /* 0 = keep NCCL's */
  uint64_t chunk_bytes;  /* 0 = keep NCCL's */
} rule_t;

typedef struct {
  size_t nrules;
  rule_t rules[];
} context_t;

static const struct {
  const char* name;
  int func;
} KINDS[] = {
    {"all-reduce", LGM_FUNC_ALL_REDUCE}, {"all-gather", LGM_FUNC_ALL_GATHER},
    {"reduce-scatter", LGM_FUNC_REDUCE_SCATTER}, {"all-to-all", LGM_FUNC_ALL_TO_ALL},
    {"broadcast", LGM_FUNC_BROADCAST}, {"reduce", LGM_FUNC_REDUCE},
};
#define KNOWN_KINDS "all-reduce, all-gather, reduce-scatter, all-to-all, broadcast, reduce, *"

/* Indexed by LGM_ALGO_* / LGM_PROTO_*. */
static const char* const ALGOS[] = {"tree", "ring", "collnet_direct", "collnet_chain",
                                    "nvls", "nvls_tree", "pat"};
#define KNOWN_ALGOS "tree, ring, collnet_direct, collnet_chain, nvls, nvls_tree, pat, *"
static const char* const PROTOS[] = {"LL", "LL128", "Simple"};
#define KNOWN_PROTOS "LL, LL128, Simple, *"

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

static void report(lgm_logger_t log, int level, const char* fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  if (log != NULL) {
    log(level, LGM_SUBSYS_TUNING, __FILE__, __LINE__, "%s", msg);
  } else if (level == LGM_LOG_WARN) {
    fprintf(stderr, "%s\n", msg);
  }
}

/* Copies `s` into `out`, shortened to SHOWN_CHARS characters plus "..." when longer. */
static const char* shown(const char* s, char out[SHOWN_CHARS + 4]) {
  size_t n = strlen(s);
  if (n <= SHOWN_CHARS) {
    memcpy(out, s, n + 1);
  } else {
    memcpy(out, s, SHOWN_CHARS);
    memcpy(out + SHOWN_CHARS, "...", 4);
  }
  return out;
}

/* Plain decimal digits only: no sign, no spaces, no hex; fails on overflow. */
static int parse_u64(const char* s, uint64_t* out) {
  if (*s == '\0') return 0;
  for (const char* p = s; *p; ++p) {
    if (*p < '0' || *p > '9') return 0;
  }
  errno = 0;
  unsigned long long v = strtoull(s, NULL, 10);
  if (errno == ERANGE) return 0;
  *out = (uint64_t)v;
  return 1;
}

static int lookup(const char* s, const char* const* names, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (strcmp(s, names[i]) == 0) return (int)i;
  }
  return ANY - 1;
}

/* Parses one rule from its NFIELDS tokens. Returns 1 on success; on failure writes the
 * reason into err. The messages are mirrored word for word by config.py's parse_config. */
static int parse_rule(char* const* f, rule_t* r, char* err, size_t errlen) {
  char a[SHOWN_CHARS + 4], b[SHOWN_CHARS + 4];
  uint64_t v;

  r->kind = ANY - 1;
  if (strcmp(f[0], "*") == 0) r->kind = ANY;
  for (size_t i = 0; i < COUNT(KINDS); ++i) {
    if (strcmp(f[0], KINDS[i].name) == 0) r->kind = KINDS[i].func;
  }
  if (r->kind == ANY - 1) {
    snprintf(err, errlen, "unknown kind '%s' (known: " KNOWN_KINDS ")", shown(f[0], a));
    return 0;
  }
  if (!parse_u64(f[1], &r->min_bytes)) {
    snprintf(err, errlen, "min_bytes: expected a non-negative integer, got '%s'", shown(f[1], a));
    return 0;
  }
  r->bounded = strcmp(f[2], "*") != 0;
  if (r->bounded && !parse_u64(f[2], &r->max_bytes)) {
    snprintf(err, errlen, "max_bytes: expected a non-negative integer or *, got '%s'",
             shown(f[2], a));
    return 0;
  }
  static const char* const COMM_FIELDS[] = {"nranks", "nnodes"};
  for (int i = 0; i < 2; ++i) {
    uint64_t* dst = i == 0 ? &r->nranks : &r->nnodes;
    *dst = 0;
    if (strcmp(f[3 + i], "*") == 0) continue;
    if (!parse_u64(f[3 + i], &v) || v == 0) {
      snprintf(err, errlen, "%s: expected a positive integer or *, got '%s'", COMM_FIELDS[i],
               shown(f[3 + i], a));
      return 0;
    }
    *dst = v;
  }
  r->algo = strcmp(f[5], "*") == 0 ? ANY : lookup(f[5], ALGOS, COUNT(ALGOS));
  if (r->algo == ANY - 1) {
    snprintf(err, errlen, "unknown algorithm '%s' (known: " KNOWN_ALGOS ")", shown(f[5], a));
    return 0;
  }
  r->proto = strcmp(f[6], "*") == 0 ? ANY : lookup(f[6], PROTOS, COUNT(PROTOS));
  if (r->proto == ANY - 1) {
    snprintf(err, errlen, "unknown protocol '%s' (known: " KNOWN_PROTOS ")", shown(f[6], a));
    return 0;
  }
  if (!parse_u64(f[7], &v) || v > MAX_CHANNELS) {
    snprintf(err, errlen,
             "nchannels: expected an integer in [0, %d] (0 keeps NCCL's choice), got '%s'",
             MAX_CHANNELS, shown(f[7], a));
    return 0;
  }
  r->nchannels = (int)v;
  if (!parse_u64(f[8], &r->chunk_bytes)) {
    snprintf(err, errlen,
             "chunk_bytes: expected a non-negative integer (0 keeps NCCL's choice), got '%s'",
             shown(f[8], a));
    return 0;
  }
  if (r->bounded && r->min_bytes >= r->max_bytes) {
    snprintf(err, errlen, "empty byte range: min_bytes %llu >= max_bytes %llu",
             (unsigned long long)r->min_bytes, (unsigned long long)r->max_bytes);
    return 0;
  }
  if ((r->algo == ANY) != (r->proto == ANY)) {
    snprintf(err, errlen,
             "algorithm and protocol must both be * or both be set, got '%s' and '%s'",
             shown(f[5], a), shown(f[6], b));
    return 0;
  }
  return 1;
}

static void strip_trailing_space(char* s) {
  size_t n = strlen(s);
  while (n > 0 && strchr(" \t\r\n\v\f", s[n - 1]) != NULL) s[--n] = '\0';
}

/* Reads every valid rule of the file at `path` into *out (malloc'd); returns their count. */
static size_t load_rules(const char* path, lgm_logger_t log, rule_t** out) {
  *out = NULL;
  FILE* file = fopen(path, "r");
  if (file == NULL) {
    char why[256] = "unknown error";
    strerror_r(errno, why, sizeof(why));
    report(log, LGM_LOG_WARN, "lagom-tuner: cannot open %s=%s (%s); NCCL keeps its own choices",
           CONFIG_ENV, path, why);
    return 0;
  }
  char* line = NULL;
  size_t cap = 0, nrules = 0, maxrules = 0;
  unsigned long lineno = 0;
  char err[512];
  while (getline(&line, &cap, file) != -1) {
    ++lineno;
    if (lineno == 1) {
      strip_trailing_space(line);
      if (strcmp(line, CONFIG_HEADER) != 0) {
        char a[SHOWN_CHARS + 4];
        report(log, LGM_LOG_WARN, "lagom-tuner: %s:%lu: expected '%s' on line 1, got '%s'", path,
               lineno, CONFIG_HEADER, shown(line, a));
        break;
      }
      continue;
    }
    char* hash = strchr(line, '#');
    if (hash != NULL) *hash = '\0';
    char* fields[NFIELDS];
    int nfields = 0;
    char* save = NULL;
    for (char* tok = strtok_r(line, " \t\r\n\v\f", &save); tok != NULL;
         tok = strtok_r(NULL, " \t\r\n\v\f", &save)) {
      if (nfields < NFIELDS) fields[nfields] = tok;
      ++nfields;
    }
    if (nfields == 0) continue;
    rule_t rule;
    if (nfields != NFIELDS) {
      snprintf(err, sizeof(err),
               "expected %d fields (kind min_bytes max_bytes nranks nnodes algorithm protocol "
               "nchannels chunk_bytes), got %d",
               NFIELDS, nfields);
    } else if (parse_rule(fields, &rule, err, sizeof(err))) {
      if (nrules == maxrules) {
        size_t grown = maxrules == 0 ? 16 : 2 * maxrules;
        rule_t* bigger = realloc(*out, grown * sizeof(rule_t));
        if (bigger == NULL) {
          report(log, LGM_LOG_WARN, "lagom-tuner: %s:%lu: out of memory; later rules ignored",
                 path, lineno);
          break;
        }
        *out = bigger;
        maxrules = grown;
      }
      (*out)[nrules++] = rule;
      continue;
    }
    report(log, LGM_LOG_WARN, "lagom-tuner: %s:%lu: %s", path, lineno, err);
  }
  if (ferror(file)) {
    char why[256] = "unknown error";
    strerror_r(errno, why, sizeof(why));
    report(log, LGM_LOG_WARN, "lagom-tuner: cannot read %s=%s (%s); rules after line %lu ignored",
           CONFIG_ENV, path, why, lineno);
  } else if (lineno == 0) {
    report(log, LGM_LOG_WARN, "lagom-tuner: %s:1: empty file: expected '%s' on line 1", path,
           CONFIG_HEADER);
  }
  free(line);
  fclose(file);
  return nrules;
}

/* Builds a communicator's context: the config's rules that can match its nRanks/nNodes. */
static void* make_context(size_t nRanks, size_t nNodes, lgm_logger_t log) {
  const char* path = getenv(CONFIG_ENV);
  rule_t* rules = NULL;
  size_t nrules = 0;
  if (path == NULL || *path == '\0') {
    report(log, LGM_LOG_WARN, "lagom-tuner: %s is not set; NCCL keeps its own choices",
           CONFIG_ENV);
  } else {
    nrules = load_rules(path, log, &rules);
  }
  size_t kept = 0;
  for (size_t i = 0; i < nrules; ++i) {
    if ((rules[i].nranks == 0 || rules[i].nranks == nRanks) &&
        (rules[i].nnodes == 0 || rules[i].nnodes == nNodes)) {
      rules[kept++] = rules[i];
    }
  }
  context_t* ctx = malloc(sizeof(context_t) + kept * sizeof(rule_t));
  if (ctx != NULL) {
    ctx->nrules = kept;
    if (kept > 0) memcpy(ctx->rules, rules, kept * sizeof(rule_t));
    report(log, LGM_LOG_INFO, "lagom-tuner: %zu of %zu rules apply to nranks=%zu nnodes=%zu",
           kept, nrules, nRanks, nNodes);
  }
  free(rules);
  return ctx; /* NULL (out of memory) behaves as an empty config */
}

static const rule_t* find_rule(const context_t* ctx, lgm_func_t coll, size_t nBytes) {
  if (ctx == NULL) return NULL;
  for (size_t i = 0; i < ctx->nrules; ++i) {
    const rule_t* r = &ctx->rules[i];
    if ((r->kind == ANY || r->kind == coll) && nBytes >= r->min_bytes &&
        (!r->bounded || nBytes < r->max_bytes)) {
      return r;
    }
  }
  return NULL;
}

static lgm_result_t coll_info(void* context, lgm_func_t collType, size_t nBytes,
                              float** collCostTable, int numAlgo, int numProto, int* nChannels) {
  const rule_t* r = find_rule(context, collType, nBytes);
  if (r == NULL) return LGM_SUCCESS;
  if (r->algo != ANY) {
    if (collCostTable == NULL || r->algo >= numAlgo || r->proto >= numProto) return LGM_SUCCESS;
    float* cost = (float*)collCostTable + (size_t)r->algo * (size_t)numProto + (size_t)r->proto;
    /* Negative = NCCL_ALGO_PROTO_IGNORE: NCCL cannot run this combination here. */
    if (*cost < 0.0f) return LGM_SUCCESS;
    /* NCCL picks the cheapest non-ignored entry; real costs are positive latencies. */
    *cost = 0.0f;
  }
  if (r->nchannels > 0 && nChannels != NULL) *nChannels = r->nchannels;
  return LGM_SUCCESS;
}

static lgm_result_t init_v3(size_t nRanks, size_t nNodes, lgm_logger_t log, void** context) {
  *context = make_context(nRanks, nNodes, log);
  return LGM_SUCCESS;
}

static lgm_result_t init_v5(void** context, uint64_t commId, size_t nRanks, size_t nNodes,
                            lgm_logger_t log, lgm_nvl_domain_info_v5_t* nvlDomainInfo,
                            lgm_tuner_constants_v5_t* constants) {
  (void)commId;
  (void)nvlDomainInfo;
  (void)constants; /* NCCL's cost-model constants stay as NCCL set them */
  *context = make_context(nRanks, nNodes, log);
  return LGM_SUCCESS;
}

static lgm_result_t coll_info_v3(void* context, lgm_func_t collType, size_t nBytes,
                                 int numPipeOps, float** collCostTable, int numAlgo,
                                 int numProto, int* nChannels) {
  (void)numPipeOps;
  return coll_info(context, collType, nBytes, collCostTable, numAlgo, numProto, nChannels);
}

static lgm_result_t coll_info_v4(void* context, lgm_func_t collType, size_t nBytes,
                                 int numPipeOps, float** collCostTable, int numAlgo,
                                 int numProto, int regBuff, int* nChannels) {
  (void)numPipeOps;
  (void)regBuff;
  return coll_info(context, collType, nBytes, collCostTable, numAlgo, numProto, nChannels);
}

static lgm_result_t chunk_size_v6(void* context, lgm_func_t collType, size_t nBytes, int algo,
                                  int proto, int nChannels, size_t* chunkSize) {
  (void)nChannels;
  const rule_t* r = find_rule(context, collType, nBytes);
  if (r == NULL || r->chunk_bytes == 0 || chunkSize == NULL) return LGM_SUCCESS;
  /* A chunk tuned for one algorithm/protocol is meaningless for another. */
  if (r->algo != ANY && (r->algo != algo || r->proto != proto)) return LGM_SUCCESS;
  *chunkSize = (size_t)r->chunk_bytes;
  return LGM_SUCCESS;
}

static lgm_result_t destroy(void* context) {
  free(context);
  return LGM_SUCCESS;
}

/* NCCL 2.30+ looks for v6 first, then v5, v4, v3 (src/plugin/tuner.cc). */
LGM_EXPORT const lgm_tuner_v6_t ncclTunerPlugin_v6 = {"lagom", init_v5, coll_info_v4, destroy,
                                                      chunk_size_v6};
LGM_EXPORT const lgm_tuner_v5_t ncclTunerPlugin_v5 = {"lagom", init_v5, coll_info_v4, destroy};
LGM_EXPORT const lgm_tuner_v4_t ncclTunerPlugin_v4 = {"lagom", init_v3, coll_info_v4, destroy};
LGM_EXPORT const lgm_tuner_v3_t ncclTunerPlugin_v3 = {"lagom", init_v3, coll_info_v3, destroy};
