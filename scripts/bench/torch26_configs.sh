# Sourced by scripts/bench-*.sh (which set $repo and log()).
# torch26_configs LIST: LIST is comma-separated configuration names. When the torch 2.6 root of
# scripts/torch26-root.sh is built, prints LIST unchanged and returns 0; otherwise says so through log(),
# prints LIST without the names that contain "2.6", and returns 1.
torch26_configs() {
  if "$repo/scripts/torch26-root.sh" path >/dev/null 2>&1; then
    echo "$1"
    return 0
  fi
  log "no torch 2.6 root (scripts/torch26-root.sh builds it): the torch 2.6 configurations are left out"
  tr ',' '\n' <<<"$1" | grep -v -- '2\.6' | paste -sd, -
  return 1
}

# with_torch26 LIST: sets $configs to torch26_configs LIST, and the array torch26_args to the benchmark
# helpers' "--torch26-root R --torch26-python P" when the root is built (else empty).
with_torch26() {
  torch26_args=()
  if configs=$(torch26_configs "$1"); then
    torch26_args=(--torch26-root "$repo/scripts/torch26-root.sh" --torch26-python "$repo/scripts/torch26-python")
  fi
}
