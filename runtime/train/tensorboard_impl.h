/* runtime/train/tensorboard_impl.h — TensorBoard event files
 * (tensorboard.c): scalars and histograms written as TensorFlow's summary
 * writer writes them, so `tensorboard --logdir DIR` shows a run with no
 * TensorFlow installed. Private to runtime/train/ (the training loop
 * writes them); tests/ include it too.
 *
 * A writer is used from one thread. Records go through stdio's buffer:
 * only mpt_tb_flush (and mpt_tb_close) make sure they are in the file, so
 * the caller picks how often TensorBoard is sure to see new points (once
 * an epoch, say). */
#ifndef MPT_RUNTIME_TRAIN_TENSORBOARD_IMPL_H
#define MPT_RUNTIME_TRAIN_TENSORBOARD_IMPL_H

#include <stddef.h>
#include <stdint.h>

typedef struct mpt_tb mpt_tb;

/* Creates dir (and its parents) if needed and opens in it a new
 * events.out.tfevents.<unix seconds>.<hostname>.<pid>.<k>, named as
 * TensorBoard's own writer names them (k counts up past a name already
 * taken), whose first record says file_version "brain.Event:2". NULL with
 * "path: reason\n  hint: ..." in err on failure. */
mpt_tb *mpt_tb_open(const char *dir, char *err, size_t n);
/* the file being written */
const char *mpt_tb_path(const mpt_tb *w);

/* wall_time is seconds since the epoch (TensorBoard's "wall" and
 * "relative" axes). Both return 0, or -1 once a write or an allocation
 * has failed: the writer then writes nothing more, and mpt_tb_flush or
 * mpt_tb_close says why. */
int mpt_tb_scalar(mpt_tb *w, const char *tag, int64_t step, double wall_time, double value);
/* The histogram of v[0..n), bucketed as TensorFlow's tf.summary.histogram
 * (v1) buckets. NaNs and infinities are left out of it, of its buckets and
 * of its min, max, count and sums (TensorFlow refuses the whole tensor
 * instead); their number goes to *nonfinite when it is not NULL, for the
 * caller to report. */
int mpt_tb_histogram(mpt_tb *w, const char *tag, int64_t step, double wall_time,
                     const float *v, int64_t n, int64_t *nonfinite);

/* 0, or -1 with the first write error (a full disk) in err */
int mpt_tb_flush(mpt_tb *w, char *err, size_t n);
/* flushes, closes and frees w (NULL is a no-op); 0, or -1 with the first
 * write error in err. The records written before an error stay readable. */
int mpt_tb_close(mpt_tb *w, char *err, size_t n);

/* the record framing, exposed for the tests: CRC-32C (Castagnoli) of
 * p[0..n), and TFRecord's mask of a CRC */
uint32_t mpt_crc32c(const void *p, size_t n);
uint32_t mpt_tb_mask_crc(uint32_t crc);

#endif
