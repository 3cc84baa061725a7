#!/usr/bin/env bash
# What a lent GPU node lacks for ViZDoom beside Sample Factory (issue 39's GPU half), packed to travel with the
# working tree: run it here, where pip reaches the registries; the node reaches none.
#   benchmarks/device_bundle.sh .devbundle          # writes .devbundle/bundle.tar.xz (ignored by git)
#   run(carry=[".devbundle"], command="benchmarks/gpu_node.sh $OUT")   # gpu_node.sh unpacks it and adds the side
# The node's image holds torch, numpy 2, opencv, psutil, tensorboard, filelock and threadpoolctl (the device
# README's KINDS.md); carried are, each installed with `pip install --target` for its CPython (3.12; PY_VERSION)
# on manylinux x86-64:
#   common/  vizdoom 1.3.2 without freedoom1.wad (Doom 1's; every scenario here plays freedoom2), pygame-ce (its
#            gymnasium wrapper imports it), Farama-Notifications
#   hpcrl/   gymnasium 1.x, for hpcrl's side
#   sf/      Sample Factory 2.1.1 and what it pins apart from hpcrl: gymnasium 0.29.1 and numpy 1.26.4 (under numpy 2
#            its rollout workers die at their first step), faster-fifo, signal-slot-mp, tensorboardX, colorlog
# The wheels alone are 77 MB, over a call's 64 MiB; unpacked without Doom 1 and compressed whole, the bundle is
# well under it. EXTRA="pkg==v ..." adds packages to common/ (a local try on a Python whose base lacks the
# node's: opencv-python-headless, tensorboard).
set -euo pipefail
out=${1:?usage: benchmarks/device_bundle.sh DIR}
py_version=${PY_VERSION:-3.12}
platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
           --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
common=(vizdoom==1.3.2 pygame-ce==2.5.8 Farama-Notifications==0.0.6 ${EXTRA:-})
hpcrl_side=(gymnasium==1.4.0)
sf_side=(sample-factory==2.1.1 gymnasium==0.29.1 numpy==1.26.4 faster-fifo==1.5.2 signal-slot-mp==1.0.5 tensorboardX==2.6.5
         colorlog==6.12.0)
work=$(mktemp -d)
part=
trap 'rm -rf "$work" ${part:+"$part"}' EXIT
trap 'exit 143' TERM  # bash runs no EXIT trap for a signal it has no trap for
trap 'exit 130' INT
install() {  # install DIR PACKAGE...: exactly these, no dependencies, as the node's Python takes them
  local dir=$1; shift
  python3 -m pip install --quiet --no-deps --no-compile --only-binary=:all: --python-version "$py_version" \
    --implementation cp "${platforms[@]}" --target "$work/bundle/$dir" "$@"
}
install common "${common[@]}"
install hpcrl "${hpcrl_side[@]}"
install sf "${sf_side[@]}"
rm -f "$work/bundle/common/vizdoom/freedoom1.wad"
mkdir -p "$out"
part=$(mktemp "$out/.bundle.XXXXXX")  # two runs at once each write their own, and the last one's whole file stays
tar -C "$work" -cJf "$part" bundle
chmod 644 "$part"
mv "$part" "$out/bundle.tar.xz"
echo "$out/bundle.tar.xz: $(du -k "$out/bundle.tar.xz" | cut -f1) KiB (Python $py_version)"
