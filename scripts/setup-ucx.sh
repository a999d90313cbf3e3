#!/usr/bin/env bash
# Lets UCX use uroce devices: the one step that needs root, once per boot,
# and only where /dev/infiniband does not exist yet.
#
# UCX (1.13.1, and its master today) lists a verbs device only when
# stat("/dev/infiniband/" + ibv_device.dev_name) is a character device that
# access(R_OK|W_OK) allows (uct_ib_device_is_accessible, src/uct/ib/base/
# ib_md.c); otherwise it skips the device without a word, and no setting
# changes or skips the check. uroce has no kernel part and never opens a
# node, so its devices report dev_name "../null": the path UCX checks is
# /dev/infiniband/../null, i.e. /dev/null, which anyone may read and write.
# The kernel resolves ".." only through an existing directory, though, so
# /dev/infiniband must exist. It does wherever the kernel's RDMA stack has a
# device (an RDMA NIC, rxe); elsewhere (containers, most laptops) this makes
# it, empty. /dev is rebuilt at boot: --persist also writes
# /etc/tmpfiles.d/uroce-ucx.conf so that systemd-tmpfiles makes it at boot.
#
# Usage: sudo scripts/setup-ucx.sh [--persist]
#        scripts/setup-ucx.sh --check   (exit 0 when UCX can see uroce devices; changes nothing)
set -euo pipefail
check=0 persist=0
for a in "$@"; do
    case "$a" in
        --check) check=1 ;;
        --persist) persist=1 ;;
        -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
        *) echo "setup-ucx: unknown argument $a" >&2; exit 2 ;;
    esac
done
node=/dev/infiniband/../null
if [ $check = 1 ]; then
    if [ -c $node ] && [ -r $node ] && [ -w $node ]; then exit 0; fi
    echo "/dev/infiniband is not set up (scripts/setup-ucx.sh as root)"; exit 1
fi
if [ "$(id -u)" != 0 ]; then
    echo "setup-ucx: needs root (it makes the directory /dev/infiniband)" >&2; exit 1
fi
install -d -m 0755 /dev/infiniband
[ -c $node ] || { echo "setup-ucx: $node is not a character device" >&2; exit 1; }
echo "/dev/infiniband exists: UCX sees uroce devices (/dev/infiniband/../null)"
if [ $persist = 1 ]; then
    conf=/etc/tmpfiles.d/uroce-ucx.conf
    printf '# uroce devices visible to UCX (scripts/setup-ucx.sh)\nd /dev/infiniband 0755 root root -\n' > "$conf"
    echo "wrote $conf"
fi
