/* softrnic in-network aggregation: an allreduce whose sums the lab's
 * switch makes (crates/aggregation, README "In-network aggregation").
 *
 * Each worker of a job opens a handle at its own address; the job's
 * parameter server (`softrnic agg server`) runs at `server`. Every worker
 * calls the allreduce with tensors of the same length, in the same order.
 * A handle is used by one thread at a time; errors are per thread.
 * Link with -lsoftrnic_aggregation (target/release/libsoftrnic_aggregation.so).
 */
#ifndef SOFTRNIC_AGGREGATION_H
#define SOFTRNIC_AGGREGATION_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct softrnic_agg softrnic_agg;

/* "IP" or "IP:PORT" (port 0 or none: 4793). NULL on error. */
softrnic_agg *softrnic_agg_open(const char *local, const char *server, uint16_t job, uint8_t worker,
                                uint8_t workers);

/* values[i] becomes the sum over all workers. 0: exact; 1: a sum saturated
 * at INT32_MIN/INT32_MAX; -1: failed (softrnic_agg_last_error). */
int softrnic_agg_allreduce_i32(softrnic_agg *agg, int32_t *values, size_t len);

/* Floats summed in fixed point with frac_bits fractional bits: each sum is
 * within workers * 2^-(frac_bits+1) of the exact one. Returns as above. */
int softrnic_agg_allreduce_f32(softrnic_agg *agg, float *values, size_t len, uint32_t frac_bits);

/* Why this thread's last call failed. */
const char *softrnic_agg_last_error(void);

void softrnic_agg_close(softrnic_agg *agg);

#ifdef __cplusplus
}
#endif

#endif
