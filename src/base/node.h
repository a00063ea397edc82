/* node.h - node identity: the name of the machine a rank runs on, as the
 * supervisor and node-targeted faults (base/fault.h, ":node=NAME") know it.
 *
 * A node map is a comma-separated list of names, NAME matching
 * [A-Za-z0-9._-]{1,63}, at most MS_NODE_MAP_MAX of them: world rank r of a
 * world of w ranks belongs to node names[r * n / w] (n names: contiguous
 * blocks of ranks).  Without a map the node is this host's name (characters
 * outside the set replaced by '_', cut to 63 bytes).
 *
 * Who calls it: the trainer (--node-map), `megascale diag` (--node-map).
 * Memory: the caller's buffers.  Thread-safety: pure functions.
 */
#ifndef MS_NODE_H
#define MS_NODE_H

#include <stddef.h>

#include "base/status.h"

#define MS_NODE_NAME_MAX 64 /* bytes of a name, its NUL included */
#define MS_NODE_MAP_MAX 4096

/* 1 if name is a node name: 1 to 63 bytes of [A-Za-z0-9._-]. */
int ms_node_name_ok(const char *name);
/* The node of world rank `rank` of `world` into out (MS_NODE_NAME_MAX
 * bytes): from map (NULL or "": the host name).  `what` names the option
 * in messages ("--node-map (MS_NODE_MAP)").  Errors: MS_ERR_ARG naming the
 * option and the entry at fault (an empty or malformed name, too many). */
ms_status ms_node_of(const char *map, int rank, int world, char out[MS_NODE_NAME_MAX],
                     const char *what);

#endif
