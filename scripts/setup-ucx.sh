#!/usr/bin/env bash
# Lets UCX use uroce devices: the one step that needs root, once per boot.
#
# UCX (1.13.1, and its master today) lists a verbs device only when
# stat("/dev/infiniband/" + ibv_device.dev_name) is a character device that
# access(R_OK|W_OK) allows (uct_ib_device_is_accessible, src/uct/ib/base/
# ib_md.c); otherwise it skips the device without a word. The path is that
# fixed prefix and the name, with no setting to change or skip the check, and
# /dev/infiniband does not exist without RDMA hardware, so no name a device
# can report reaches a file without it. uroce never opens that node (it has
# no kernel part): a symbolic link to /dev/null (a character device anyone
# may open) is enough. For each device NAME (default uroce0) this makes
#   /dev/infiniband/uverbs-NAME -> /dev/null
# (the drop-in library's dev_name is "uverbs-NAME"). /dev is rebuilt at boot:
# --persist also writes /etc/tmpfiles.d/uroce-ucx.conf so that
# systemd-tmpfiles makes the links at every boot.
#
# Usage: sudo scripts/setup-ucx.sh [--persist] [NAME ...]
#        scripts/setup-ucx.sh --check [NAME ...]  (exit 0 when UCX can see them; changes nothing)
set -euo pipefail
check=0 persist=0 names=()
for a in "$@"; do
    case "$a" in
        --check) check=1 ;;
        --persist) persist=1 ;;
        -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
        -*) echo "setup-ucx: unknown option $a" >&2; exit 2 ;;
        *) [[ "$a" =~ ^[A-Za-z0-9_.-]{1,56}$ ]] || { echo "setup-ucx: bad device name '$a'" >&2; exit 2; }
           names+=("$a") ;;
    esac
done
[ ${#names[@]} -eq 0 ] && names=(uroce0)

accessible() { [ -c "$1" ] && [ -r "$1" ] && [ -w "$1" ]; }

if [ $check = 1 ]; then
    for n in "${names[@]}"; do
        accessible "/dev/infiniband/uverbs-$n" || { echo "/dev/infiniband/uverbs-$n is not set up"; exit 1; }
    done
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "setup-ucx: needs root (it writes under /dev/infiniband)" >&2; exit 1
fi
install -d -m 0755 /dev/infiniband
for n in "${names[@]}"; do
    node="/dev/infiniband/uverbs-$n"
    if [ -L "$node" ] || [ ! -e "$node" ]; then
        ln -sfn /dev/null "$node"
    elif ! accessible "$node"; then
        echo "setup-ucx: $node exists and is not a link; left as it is" >&2; exit 1
    fi
    echo "$node -> $(readlink -f "$node")"
done
if [ $persist = 1 ]; then
    conf=/etc/tmpfiles.d/uroce-ucx.conf
    { echo "# uroce devices visible to UCX (scripts/setup-ucx.sh)"
      echo "d /dev/infiniband 0755 root root -"
      for n in "${names[@]}"; do echo "L+ /dev/infiniband/uverbs-$n - - - - /dev/null"; done
    } > "$conf"
    echo "wrote $conf"
fi
