#!/bin/bash
# Builds what the kernel-rxe test boots (crates/uroce-ibverbs/tests/kernel_rxe.rs):
# Debian's kernel (linux-image-amd64, fetched with `apt-get download` and unpacked with
# `dpkg -x` into a cache directory: never installed as the host's kernel) and an initramfs
# assembled from Debian packages: busybox-static as init, the RDMA and NIC modules with their
# dependencies, and the host's Debian rdma-core, ibverbs-providers (librxe), ibverbs-utils,
# rdmacm-utils, perftest and iproute2 binaries (ip, tc) with every library they load (ldd, plus
# libgcc_s.so.1, which pthread_exit loads at run time), and uroce-mw (mw.c), built here, which
# the host runs too (it is left in CACHE_DIR).
#
# Usage: scripts/rxe-vm/build.sh [CACHE_DIR]   (default: target/rxe-vm)
# Prints the directory holding vmlinuz and initrd.cpio.gz on its last line.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
cache="${1:-${UROCE_RXE_VM_CACHE:-$repo/target/rxe-vm}}"
mkdir -p "$cache"
cd "$cache"

# 1. The kernel package (the metapackage names the image package).
kpkg="$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')"
[ -n "$kpkg" ] || { echo "no linux-image-amd64 candidate (apt-get update?)" >&2; exit 2; }
if [ ! -f "kernel/$kpkg.done" ]; then
    rm -rf kernel deb && mkdir -p kernel deb
    (cd deb && apt-get download "$kpkg" >/dev/null) || { echo "apt-get download $kpkg failed" >&2; exit 2; }
    dpkg -x deb/*.deb kernel
    touch "kernel/$kpkg.done"
fi
kver="${kpkg#linux-image-}"
moddir="kernel/lib/modules/$kver"
[ -d "$moddir" ] || { echo "no modules in $moddir" >&2; exit 2; }
cp -f kernel/boot/vmlinuz-"$kver" vmlinuz

# 2. The initramfs tree.
stamp="$(cat "$here/build.sh" "$here/init" "$here/mw.c" | sha256sum | cut -c1-16)-$kver"
if [ -f initrd.cpio.gz ] && [ "$(cat initrd.stamp 2>/dev/null)" = "$stamp" ]; then
    echo "$cache"; exit 0
fi
root="$cache/root"
rm -rf "$root"
mkdir -p "$root"/{bin,sbin,etc,proc,sys,dev,tmp,run,lib/modules,usr/bin,usr/lib,var/tmp}
ln -s lib "$root/lib64"
cp /bin/busybox "$root/bin/busybox"
file "$root/bin/busybox" | grep -q 'statically linked' || { echo "busybox is not static (install busybox-static)" >&2; exit 2; }
for a in sh ash cat echo ls mkdir mount insmod sleep dmesg stty ps kill cp rm ifconfig sync \
         grep sed head tail wc seq true false test tr env date uname poweroff mknod nc cut sha256sum dd hexdump timeout setsid killall base64; do
    ln -sf busybox "$root/bin/$a"
done
cp "$here/init" "$root/init"
chmod 755 "$root/init"

# Modules in load order (each after what it depends on, from its .modinfo `depends=`; the
# package ships no modules.dep, which its postinst makes with depmod). The last five let the
# test hold back CM REQs on their way in (tc: ingress, u32, mirred to an ifb with netem).
mods=(crc32_generic udp_tunnel ip6_udp_tunnel ib_core ib_uverbs ib_cm iw_cm rdma_cm rdma_ucm rdma_rxe e1000
      sch_ingress cls_u32 act_mirred ifb sch_netem)
declare -A seen=()
order=()
add_mod() {
    local name="$1" path dep deps
    path="$(find "$moddir/kernel" \( -name "$name.ko" -o -name "$name.ko.*" -o -name "${name//_/-}.ko" -o -name "${name//_/-}.ko.*" \) | head -1)"
    [ -n "$path" ] || { echo "module $name not in $moddir" >&2; exit 2; }
    path="${path#"$moddir/"}"
    [ -n "${seen[$path]:-}" ] && return 0
    seen[$path]=1
    case "$path" in
        *.xz) deps="$(xz -dc "$moddir/$path" | grep -ao 'depends=[^[:cntrl:]]*' | head -1)";;
        *.zst) deps="$(zstd -qdc "$moddir/$path" | grep -ao 'depends=[^[:cntrl:]]*' | head -1)";;
        *) deps="$(grep -ao 'depends=[^[:cntrl:]]*' "$moddir/$path" | head -1)";;
    esac
    deps="${deps#depends=}"
    for dep in ${deps//,/ }; do
        add_mod "$dep"
    done
    order+=("$path")
}
for m in "${mods[@]}"; do add_mod "$m"; done
: > "$root/etc/modules"
for p in "${order[@]}"; do
    b="$(basename "$p")"
    case "$p" in
        *.xz) xz -dc "$moddir/$p" > "$root/lib/modules/${b%.xz}"; b="${b%.xz}";;
        *.zst) zstd -qdc "$moddir/$p" > "$root/lib/modules/${b%.zst}"; b="${b%.zst}";;
        *) cp "$moddir/$p" "$root/lib/modules/$b";;
    esac
    echo "$b" >> "$root/etc/modules"
done

# Userspace from the host's Debian packages, with their libraries.
bins=(/usr/bin/ibv_rc_pingpong /usr/bin/ibv_uc_pingpong /usr/bin/ibv_ud_pingpong /usr/bin/ibv_srq_pingpong
      /usr/bin/ibv_devinfo /usr/bin/ibv_devices /usr/bin/rping /usr/bin/ucmatose /usr/bin/udaddy /usr/bin/rstream
      /usr/bin/rdma /sbin/ip /sbin/tc /usr/bin/ib_write_bw /usr/bin/ib_read_bw /usr/bin/ib_send_bw /usr/bin/ib_atomic_bw
      /usr/bin/ib_write_lat /usr/bin/ib_read_lat /usr/bin/ib_send_lat /usr/bin/ib_atomic_lat)
libs=()
for b in "${bins[@]}"; do
    [ -x "$b" ] || { b2="$(command -v "$(basename "$b")" || true)"; [ -n "$b2" ] || { echo "missing $b" >&2; exit 2; }; b="$b2"; }
    cp -L "$b" "$root/usr/bin/"
    libs+=("$b")
done
# uroce-mw (memory windows both ways; mw.c), for the VM and for the host.
gcc -O1 -Wall -o "$cache/uroce-mw" "$here/mw.c" -libverbs || { echo "building uroce-mw failed (libibverbs-dev?)" >&2; exit 2; }
cp "$cache/uroce-mw" "$root/usr/bin/uroce-mw"
libs+=("$cache/uroce-mw")
provider_dir=/usr/lib/x86_64-linux-gnu/libibverbs
mkdir -p "$root$provider_dir" "$root/etc/libibverbs.d"
cp -L "$provider_dir/librxe-rdmav34.so" "$root$provider_dir/" 2>/dev/null || cp -L "$provider_dir"/librxe-rdmav*.so "$root$provider_dir/"
cp /etc/libibverbs.d/rxe.driver "$root/etc/libibverbs.d/"
libs+=("$provider_dir"/librxe-rdmav*.so)
# rsockets preload library (rstream uses rsockets natively; kept for LD_PRELOAD use).
for f in /usr/lib/x86_64-linux-gnu/rsocket/librspreload.so*; do [ -e "$f" ] && { mkdir -p "$root$(dirname "$f")"; cp -L "$f" "$root$f"; }; done
extra=(/lib/x86_64-linux-gnu/libgcc_s.so.1 /lib64/ld-linux-x86-64.so.2)
copy_lib() {
    local f="$1" real
    real="$(readlink -f "$f")"
    mkdir -p "$root/lib/x86_64-linux-gnu"
    cp -L "$real" "$root/lib/x86_64-linux-gnu/$(basename "$f")"
}
for l in $( (for b in "${libs[@]}"; do ldd "$b" 2>/dev/null; done) | awk '/=> \// {print $3} /^\t\/lib/ {print $1}' | sort -u) "${extra[@]}"; do
    copy_lib "$l"
done
cp -L /lib64/ld-linux-x86-64.so.2 "$root/lib/ld-linux-x86-64.so.2"
echo 'root:x:0:0:root:/:/bin/sh' > "$root/etc/passwd"
echo 'root:x:0:' > "$root/etc/group"
printf '127.0.0.1 localhost\n' > "$root/etc/hosts"
(cd "$root" && find . | busybox cpio -o -H newc 2>/dev/null | gzip -1) > initrd.cpio.gz.new
mv initrd.cpio.gz.new initrd.cpio.gz
echo "$stamp" > initrd.stamp
echo "$cache"
