# registry.sh, sourced by check and in of jetway's test stand-in for
# Concourse's registry-image resource: reading the request on stdin
# ($input) and the registry. The source's username and password, when it
# has both, are sent as HTTP Basic auth (the harness's registry asks for
# them under its private/ repositories); they never reach the output.

# field NAME is the string value of NAME in the request.
field() { printf '%s' "$input" | sed -n "s/.*\"$1\": *\"\([^\"]*\)\".*/\1/p"; }

repository=$(field repository); mirror=$(field mirror)
registry=${repository%%/*}
base="$mirror/v2/${repository#*/}"
basic=
if [ -n "$(field username)" ] && [ -n "$(field password)" ]; then
  basic=$(printf '%s:%s' "$(field username)" "$(field password)" | base64 -w 0)
fi

# fetch WHO PATH writes what the registry serves at $base/PATH to stdout.
# If the registry refuses or cannot be reached, WHO says on stderr what it
# answered (its status: busybox's wget keeps neither the headers nor the
# body of an error), and fetch fails.
fetch() {
  who=$1 path=$2; shift 2
  [ -n "$basic" ] && set -- --header "Authorization: Basic $basic"
  errors=$(mktemp) || return 1
  if wget -q -O- --header "Accept: application/vnd.docker.distribution.manifest.v2+json" "$@" "$base/$path" 2>"$errors"; then
    rm -f "$errors"; return 0
  fi
  status=$(sed -n 's/^wget: server returned error: HTTP\/[0-9.]* *//p' "$errors")
  if [ -n "$status" ]; then
    echo "$who: $registry answered $status for ${repository#*/}/$path" >&2
  else
    echo "$who: cannot read ${repository#*/}/$path from $registry at $mirror: $(tail -n 1 "$errors")" >&2
  fi
  rm -f "$errors"; return 1
}
