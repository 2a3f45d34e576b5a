#!/usr/bin/env bash
# Prints the Debian mirror this machine's apt is configured with for SUITE
# (default bookworm): the first URI of an enabled `deb` source for that exact
# suite, in the order apt reads its sources (sources.list, then the *.list and
# *.sources files of sources.list.d by name), one-line and deb822 formats alike.
# Exits 1 with a message when apt names none; there is no built-in fallback.
#
#   scripts/debian_mirror.sh [SUITE [APT_DIR]]    APT_DIR: default /etc/apt
set -euo pipefail

SUITE=${1:-bookworm}
APT_DIR=${2:-/etc/apt}

one_line() {  # deb [options] URI SUITE COMPONENT...
    sed -E 's/\[[^]]*\]//' "$1" |
        awk -v suite="$SUITE" '$1 == "deb" && $3 == suite { print $2; exit }'
}

deb822() {  # stanzas of "Field: value" lines (continuations indented), blank-line separated
    awk -v suite="$SUITE" '
        function trim(text) { gsub(/^[[:space:]]+|[[:space:]]+$/, "", text); return text }
        function has(list, word,   n, i, parts) {
            n = split(list, parts, /[[:space:]]+/)
            for (i = 1; i <= n; i++) if (parts[i] == word) return 1
            return 0
        }
        function stanza_end(   uri) {
            if (has(f["types"], "deb") && has(f["suites"], suite) && tolower(f["enabled"]) != "no") {
                split(trim(f["uris"]), uri, /[[:space:]]+/)
                if (uri[1] != "") { print uri[1]; done = 1; exit }
            }
            delete f
            key = ""
        }
        /^#/ { next }
        /^[[:space:]]*$/ { stanza_end(); next }
        /^[[:space:]]/ { if (key != "") f[key] = f[key] " " trim($0); next }
        {
            colon = index($0, ":")
            key = tolower(substr($0, 1, colon - 1))
            f[key] = trim(substr($0, colon + 1))
        }
        END { if (!done) stanza_end() }' "$1"
}

sources=()
[[ -f $APT_DIR/sources.list ]] && sources+=("$APT_DIR/sources.list")
if [[ -d $APT_DIR/sources.list.d ]]; then
    while IFS= read -r -d '' path; do
        sources+=("$path")
    done < <(find "$APT_DIR/sources.list.d" -maxdepth 1 -type f \( -name '*.list' -o -name '*.sources' \) -print0 | sort -z)
fi

for path in "${sources[@]}"; do
    if [[ $path == *.sources ]]; then uri=$(deb822 "$path"); else uri=$(one_line "$path"); fi
    if [[ -n $uri ]]; then
        echo "${uri%/}"
        exit 0
    fi
done
echo "no Debian mirror for '$SUITE' in apt's sources ($APT_DIR/sources.list, $APT_DIR/sources.list.d/*.list," \
    "*.sources): add a 'deb URI $SUITE main' source, or set LYNX_BASE_IMAGE to an image podman can pull" >&2
exit 1
