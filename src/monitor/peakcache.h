/* peakcache.h - the peak cache: a probed GEMM peak (monitor.h) kept in a
 * small JSON file per host, DIR/peak-HOST.json (docs/formats.md), so that a
 * restart on the same host reads it instead of probing again (about 1 s of
 * CPU per rank per start on a CPU).
 *
 * An entry holds a peak under a key of what makes it valid: the host, the
 * backend, its device (the CPU model), the act dtype, the threads per rank,
 * the ranks on the host (they probe at once), the probe's size, the fp32
 * GEMM kernel and OpenBLAS core, the ISA the binary was built for and the
 * binary itself (its size and modification time).  A file keeps up to 8
 * entries (ranks of one host with different --threads), newest first.
 *
 * Never an error that stops training: a missing, corrupt or mismatched
 * cache, or one that cannot be written, is a one-line note (a warning on
 * the host's first rank, the others' at debug level), and the rank probes.
 *
 * Concurrency: the ranks of a host read at once; the file is only ever
 * replaced through the atomic writer (base/fileio.h), so a reader sees the
 * old file or the new one, never a part.  A writer takes a non-blocking
 * flock(2) on DIR/peak-HOST.json.lock (a rank that finds it held leaves
 * the write to the holder), reads the file again under it and writes only
 * when the file lacks an entry for its key with as many probes: of the
 * ranks of a host that probed at once, one writes.
 *
 * Who calls it: mon_peak_init (load), the trainer (save, after the probes).
 * Memory: nothing kept.  Thread-safety: one thread per mon_peak.
 */
#ifndef MON_PEAKCACHE_H
#define MON_PEAKCACHE_H

#include "backend/backend.h"
#include "monitor/monitor.h"

/* Look for this host's and backend's entry in the cache in directory dir
 * (NULL, "" or "none": no cache): 1 with *p filled from it (from_probe,
 * cached, probes as the start that took them, probes_run 0), else 0 with a
 * note when a file was there but could not be used.  Either way a cache
 * dir sets p->cache_path for mon_peak_cache_save. */
int mon_peak_cache_load(mon_peak *p, const be_backend *be, const char *dir);

/* Write p's probed peak (p->probed, p->probes, p->fp32_flops) into the
 * cache at p->cache_path, when this process ran probes for it
 * (p->probes_run > 0) and the file holds no entry for the key with as many
 * probes; other keys' entries are kept.  1: written; 0: nothing to write,
 * or another rank of this host holds the lock or wrote it; -1: it could
 * not be written (noted). */
int mon_peak_cache_save(const mon_peak *p, const be_backend *be);

#endif
