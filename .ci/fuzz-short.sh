#!/usr/bin/env bash
# Runs every fuzz target of the repository for a short while, one at a time
# (`go test -fuzz` takes one target of one package). Targets are found by
# grepping the test files, so a new Fuzz function is picked up without
# editing this script. FUZZTIME (default 200000x inputs) bounds each target.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/go/bin:$PATH"
GO="${GO:-go}"
FUZZTIME="${FUZZTIME:-200000x}"

targets=()
while IFS= read -r file; do
	pkg="./$(dirname "${file#./}")"
	while IFS= read -r name; do
		targets+=("$pkg $name")
	done < <(grep -o '^func Fuzz[A-Za-z0-9_]*' "$file" | sed 's/^func //')
done < <(grep -rl --include='*_test.go' --exclude-dir=.git --exclude-dir=vendor \
	--exclude-dir=testdata 'func Fuzz' . | sort)

if [ "${#targets[@]}" -eq 0 ]; then
	echo "fuzz-short: no fuzz targets found"
	exit 0
fi
echo "fuzz-short: ${#targets[@]} targets, $FUZZTIME each"
for t in "${targets[@]}"; do
	read -r pkg name <<<"$t"
	echo "== $pkg $name"
	"$GO" test -run '^$' -fuzz "^${name}\$" -fuzztime "$FUZZTIME" "$pkg"
done
echo "fuzz-short: all ${#targets[@]} targets passed"
