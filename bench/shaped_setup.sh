# bench/shaped_setup.sh: what the benchmarks on emulated hosts (bench/shaped_links.sh,
# bench/compression_shaped.sh) do first, sourced by them: shaped_setup SCRIPT PREFIX checks for
# root, sets H (tests/hosts/hosts.sh), work (a fresh folder), name (PREFIX and this shell's pid,
# 8 characters: the emulated hosts' name) and the traps that stop those hosts and remove work on
# every exit, and writes a random job token to $work/token.
shaped_setup() {
    H="$here/../tests/hosts/hosts.sh"
    [ "$(id -u)" = 0 ] || { echo "$1: network namespaces need root" >&2; exit 1; }
    work=$(mktemp -d)
    name=$(echo "$2$$" | cut -c1-8)
    trap '"$H" stop "$name"; rm -rf "$work"' EXIT
    trap 'exit 1' INT TERM
    (umask 077 && head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$work/token")
}
