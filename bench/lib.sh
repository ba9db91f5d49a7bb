# What the benchmark scripts share; sourced, never run. Messages start with
# the name of the script that sourced this.

die() {
  echo "${0##*/}: $*" >&2
  exit 1
}

log() {
  echo "${0##*/}: $*" >&2
}

# in_range N LO HI: N is a decimal number in LO..HI.
in_range() {
  [[ $1 =~ ^[0-9]{1,6}$ ]] && [ "$1" -ge "$2" ] && [ "$1" -le "$3" ]
}
