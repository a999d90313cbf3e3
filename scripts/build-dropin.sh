#!/usr/bin/env bash
# Builds the drop-in libibverbs.so.1 into target/dropin/ (under
# $CARGO_TARGET_DIR when set) and prints its path.
# Route: the Rust crate is a staticlib (profile `dropin`: release with
# panic = "abort"), relinked by cc with a version script so that every export
# carries its rdma-core symbol version (shared/spec/abi.md §3, route B).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build -q --profile dropin -p uroce-ibverbs
out="${CARGO_TARGET_DIR:-target}/dropin"
mkdir -p "$out"
cc -shared -o "$out/libibverbs.so.1" \
   -Wl,--whole-archive "$out/liburoce_ibverbs.a" -Wl,--no-whole-archive \
   -Wl,--version-script=crates/uroce-ibverbs/libibverbs.map \
   -Wl,-soname,libibverbs.so.1 -Wl,-z,now -Wl,--gc-sections \
   -lgcc_s -lutil -lrt -lpthread -lm -ldl -lc
ln -sf libibverbs.so.1 "$out/libibverbs.so"
# The drop-in librdmacm.so.1: its exports jump to libibverbs.so.1's
# uroce_cm_* (crates/uroce-rdmacm), so both share one uroce instance.
cc -shared -fPIC -o "$out/librdmacm.so.1" crates/uroce-rdmacm/rdmacm.c \
   -Wl,--version-script=crates/uroce-rdmacm/librdmacm.map \
   -Wl,-soname,librdmacm.so.1 -Wl,-z,now -Wl,--no-as-needed -L"$out" -l:libibverbs.so.1
ln -sf librdmacm.so.1 "$out/librdmacm.so"
mkdir -p "$out/include"
cp crates/uroce-ibverbs/include/uroce.h "$out/include/"
# infiniband/verbs.h: the system's (#include_next) plus seed 003's
# declarations (uroce_noncontig.h), so seed-style programs build with
# -I"$out/include" alone.
mkdir -p "$out/include/infiniband"
cp crates/uroce-ibverbs/include/infiniband/*.h "$out/include/infiniband/"
# Seed 003's man pages (ibv_rereg_mr_interleaved.3, ibv_rereg_mr_sg.3), beside uroce.h.
mkdir -p "$out/include/man/man3"
cp crates/uroce-ibverbs/include/man/*.3 "$out/include/man/man3/"
# The drop-in libmlx5.so.1 (crates/uroce-ibverbs/mlx5/): mlx5dv entry points
# forwarded to libibverbs.so.1's UROCE_MLX5_PRIVATE exports, the rest failing
# cleanly; rdma-core 44's MLX5_1.x symbol versions.
cc -shared -fPIC -O2 -Wall -Werror -o "$out/libmlx5.so.1" \
   crates/uroce-ibverbs/mlx5/libmlx5.c crates/uroce-ibverbs/mlx5/stubs.c \
   -Wl,--version-script=crates/uroce-ibverbs/mlx5/libmlx5.map \
   -Wl,-soname,libmlx5.so.1 -Wl,-z,now -Wl,--no-as-needed "$out/libibverbs.so.1"
ln -sf libmlx5.so.1 "$out/libmlx5.so"
echo "$(cd "$out" && pwd)/libibverbs.so.1"
