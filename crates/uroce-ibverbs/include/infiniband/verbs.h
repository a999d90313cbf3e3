/* infiniband/verbs.h of the uroce drop-in: the system's libibverbs header
 * (#include_next) plus the declarations seed 003 adds to it ("verbs:
 * Introduce non-contiguous memory registration"), so that a program written
 * for the seed compiles unchanged with -I<dropin>/include. The declarations
 * are in uroce_noncontig.h, beside this file, which uroce.h includes too.
 *
 * Link with the drop-in library: -L<dir> -libverbs (symbols of UROCE_1.1).
 *
 * No guard of its own: the system header and uroce_noncontig.h have theirs.
 */

#include_next <infiniband/verbs.h>
#include "uroce_noncontig.h"
