# bash completion for lease(1).                            -*- shell-script -*-
#
# Standalone: it needs no function of the bash-completion package, so it
# works when sourced from ~/.bashrc as well as from
# /usr/share/bash-completion/completions/lease.
#
# It completes commands, each command's flags, the global flags, the URL
# schemes of the stores the binary has (from `lease --version`), file names
# for --store-file, --keys-from and --from, the kind of fence-sql, and the
# KEY of acquire, renew, release, show, history and run (each KEY of hold)
# from `lease ls` when a store is named on the command line or in
# $LEASE_STORE. That `ls` is bounded
# (--timeout 1s, and timeout(1) when there is one), so a store that cannot
# be reached costs about a second and offers nothing, never a hung prompt.

# The commands and their own flags, as `lease help COMMAND` lists them
# (tests/docs/docs_completion.sh checks that the two agree).
_lease_commands="acquire renew release show ls history run hold claim fence fence-sql \
fence-install elect leader agent help"

_lease_command_flags()
{
    case $1 in
        acquire) echo "--ttl --owner --label --wait --json" ;;
        renew) echo "--owner --token --ttl --json" ;;
        release) echo "--owner --token --json" ;;
        show | ls | fence) echo "--json" ;;
        history) echo "--limit --json" ;;
        run | elect) echo "--ttl --wait --label --grace --json --pass-store" ;;
        hold) echo "--keys-from --ttl --wait --label --grace --json --pass-store" ;;
        claim) echo "--count --of --ttl --label --grace --json --pass-store" ;;
        fence-install) echo "--from --json" ;;
        leader) echo "--watch --count --for --json" ;;
        agent) echo "--listen --label --ttl --json --max-connections --max-per-ip --idle-timeout" ;;
    esac
}

# The commands that run a command given after "--".
_lease_runs_command()
{
    case $1 in
        run | elect | hold | claim) return 0 ;;
    esac
    return 1
}

# Flags whose value is the next word (unless written --flag=value).
_lease_takes_value()
{
    case $1 in
        --store | --store-file | --timeout | --ttl | --owner | --label | --wait | \
            --token | --limit | --grace | --count | --for | --listen | --keys-from | --of | \
            --max-connections | --max-per-ip | --idle-timeout | --from) return 0 ;;
    esac
    return 1
}

# A word as the shell will pass it: surrounding quotes removed and a
# leading ~/ expanded (enough for a path or a URL typed on the line).
_lease_unquote()
{
    local w=$1
    case $w in
        \'*\') w=${w:1:${#w}-2} ;;
        \"*\") w=${w:1:${#w}-2} ;;
    esac
    case $w in
        "~") w=$HOME ;;
        "~/"*) w=$HOME/${w:2} ;;
    esac
    printf '%s' "$w"
}

# The URL schemes of the stores this binary was built with, from the line
# "stores: sqlite, postgres, redis, etcd" of `lease --version`.
_lease_schemes()
{
    local line store out="" IFS=$' \t\n'
    line=$("$1" --version 2>/dev/null | while IFS= read -r l; do
        case $l in "stores: "*) printf '%s' "${l#stores: }" ;; esac
    done)
    for store in ${line//,/ }; do
        case $store in
            sqlite) out+=" sqlite:" ;;
            postgres) out+=" postgres:// postgresql://" ;;
            redis) out+=" redis://" ;;
            etcd) out+=" etcd:// etcds://" ;;
            kubernetes) out+=" kubernetes:// kubernetes+http://" ;;
        esac
    done
    printf '%s' "$out"
}

# The keys of the store that the command line (or $LEASE_STORE) names,
# starting with $2, one per line. Parses `ls --json` minimally: the value
# of each "key" field (the text output pads and escapes keys).
_lease_keys()
{
    local lease=$1 prefix=$2 k
    shift 2
    local -a cmd=("$lease" "$@" --timeout 1s ls --json)
    case $prefix in -*) ;; ?*) cmd+=("$prefix") ;; esac
    if type -P timeout >/dev/null 2>&1; then
        cmd=(timeout -k 1 3 "${cmd[@]}")
    fi
    "${cmd[@]}" 2>/dev/null </dev/null |
        grep -oE '"key":"([^"\\]|\\.)*"' |
        while IFS= read -r k; do
            k=${k#'"key":"'}
            k=${k%'"'}
            [[ $k == *'\'* ]] && { k=$(_lease_json_unescape "$k") || continue; }
            printf '%s\n' "$k"
        done
}

# Undo the escapes \" \\ \/ of a JSON string; fails on any other (\n,
# \u00e9 ...): such a key cannot be typed back byte for byte.
_lease_json_unescape()
{
    local in=$1 out=""
    while [[ -n $in ]]; do
        case $in in
            '\"'*) out+='"' ;;
            '\\'*) out+='\' ;;
            '\/'*) out+='/' ;;
            '\'*) return 1 ;;
            *)
                out+=${in:0:1}
                in=${in:1}
                continue ;;
        esac
        in=${in:2}
    done
    printf '%s' "$out"
}

# COMPREPLY from the words in $1 that start with $2 (split on newlines, so
# that a word may hold spaces).
_lease_reply()
{
    local IFS=$'\n' w
    for w in $1; do
        [[ $w == "$2"* ]] && COMPREPLY+=("$w")
    done
}

_lease()
{
    local line cur prev lease cmd="" i w npos=0 dashdash=-1
    local -a words store_args=()
    COMPREPLY=()

    # Words as the user typed them, split on blanks only: bash's own
    # COMP_WORDS also splits at ':' and '=' (COMP_WORDBREAKS), which would
    # cut a URL into pieces.
    if [[ -n ${COMP_LINE+set} ]]; then
        line=${COMP_LINE:0:${COMP_POINT:-${#COMP_LINE}}}
    else
        line="${COMP_WORDS[*]:0:COMP_CWORD+1}"
    fi
    read -r -a words <<<"$line"
    if [[ -z $line || $line == *[[:blank:]] ]]; then
        words+=("")
    fi
    cur=${words[${#words[@]} - 1]}
    prev=""
    ((${#words[@]} > 1)) && prev=${words[${#words[@]} - 2]}
    lease=$(_lease_unquote "${words[0]:-lease}")
    if [[ $lease != */* ]] || [[ ! -x $lease ]]; then
        lease=$(type -P "$lease" 2>/dev/null || type -P lease 2>/dev/null)
    fi

    # The command, the words after it that are not flags, the store.
    for ((i = 1; i < ${#words[@]} - 1; i++)); do
        w=${words[i]}
        if ((dashdash >= 0)); then
            continue
        fi
        case $w in
            --) _lease_runs_command "$cmd" && dashdash=$i ;;
            --store=* | --store-file=*)
                store_args=("${w%%=*}" "$(_lease_unquote "${w#*=}")") ;;
            --store | --store-file)
                ((i + 1 < ${#words[@]} - 1)) &&
                    store_args=("$w" "$(_lease_unquote "${words[i + 1]}")")
                ((i++)) ;;
            -*)
                [[ $w != *=* ]] && _lease_takes_value "$w" && ((i++)) ;;
            *)
                if [[ -z $cmd ]]; then
                    cmd=$w
                else
                    ((npos++))
                fi ;;
        esac
    done

    # The value of a flag: --flag VALUE or --flag=VALUE. Candidates are
    # whole values, trimmed to what bash replaces (see _lease_trim).
    local flag="" value=$cur
    if ((dashdash < 0)); then
        if [[ $cur == --*=* ]]; then
            flag=${cur%%=*}
            value=${cur#*=}
        elif [[ $prev == --* ]] && _lease_takes_value "$prev"; then
            flag=$prev
        fi
    fi
    case $flag in
        --store)
            _lease_complete_store "$value"
            _lease_trim "$value"
            return 0 ;;
        --store-file | --keys-from | --from)
            local IFS=$'\n'
            COMPREPLY=($(compgen -f -- "$(_lease_unquote "$value")"))
            compopt -o filenames 2>/dev/null
            _lease_trim "$value"
            return 0 ;;
        ?*)
            # A duration, an owner, a token, a label: nothing to offer.
            return 0 ;;
    esac

    # After `run KEY [flags] --`, `elect NAME ... --`, `hold KEY... --` or
    # `claim PREFIX ... --`: the command to run.
    if ((dashdash >= 0)); then
        local IFS=$'\n'
        if ((${#words[@]} - 1 == dashdash + 1)); then
            COMPREPLY=($(compgen -c -- "$cur"))
        else
            COMPREPLY=($(compgen -f -- "$cur"))
            compopt -o filenames 2>/dev/null
        fi
        return 0
    fi

    if [[ $cur == -* ]]; then
        if [[ -z $cmd ]]; then
            _lease_reply $'--store\n--store-file\n--timeout\n--json\n--help\n--version' "$cur"
        else
            local flags
            flags="$(_lease_command_flags "$cmd") --store --store-file --timeout --help"
            _lease_runs_command "$cmd" && flags+=" --"
            _lease_reply "${flags// /$'\n'}" "$cur"
        fi
        _lease_trim "$cur"
        return 0
    fi

    if [[ -z $cmd ]]; then
        _lease_reply "${_lease_commands// /$'\n'}" "$cur"
        return 0
    fi

    # The first word after the command that is not a flag (any, for hold).
    ((npos == 0)) || [[ $cmd == hold ]] || return 0
    case $cmd in
        help)
            _lease_reply "${_lease_commands// /$'\n'}" "$cur" ;;
        fence-sql)
            _lease_reply $'postgres\nsqlite' "$cur" ;;
        fence-install)
            # The scheme of its URL, when this lease has the Redis store.
            if [[ " $(_lease_schemes "$lease") " == *" redis://"* ]]; then
                _lease_reply "redis://" "$cur"
                compopt -o nospace 2>/dev/null
                _lease_trim "$cur"
            fi ;;
        acquire | renew | release | show | history | run | hold)
            if [[ ${#store_args[@]} -gt 0 || -n ${LEASE_STORE:-} ]] && [[ -n $lease ]]; then
                _lease_reply "$(_lease_keys "$lease" "$(_lease_unquote "$cur")" \
                    ${store_args[@]+"${store_args[@]}"})" "$cur"
                _lease_trim "$cur"
            fi ;;
    esac
    return 0
}

# --store VALUE: the schemes, then file names after sqlite: (the embedded
# store's path).
_lease_complete_store()
{
    local value=$1 scheme path f
    case $value in
        sqlite:*)
            local IFS=$'\n'
            scheme=sqlite:
            [[ $value == sqlite://* ]] && scheme=sqlite://
            path=${value#"$scheme"}
            for f in $(compgen -f -- "$path"); do
                [[ -d $f ]] && f+=/
                COMPREPLY+=("$scheme$f")
            done
            compopt -o nospace 2>/dev/null ;;
        *)
            local schemes
            schemes=$(_lease_schemes "$lease")
            _lease_reply "${schemes// /$'\n'}" "$value"
            compopt -o nospace 2>/dev/null ;;
    esac
}

# Bash replaces only the part of the word after the last character of
# COMP_WORDBREAKS (':' and '=' by default): cut what comes before it off
# each candidate, or `--store sqlite:<TAB>` would insert "sqlite:sqlite:".
_lease_trim()
{
    local cur=$1 breaks=${COMP_WORDBREAKS-$' \t\n"\'><=;|&(:'} lead="" i c
    for ((i = ${#cur} - 1; i >= 0; i--)); do
        c=${cur:i:1}
        if [[ $breaks == *"$c"* ]]; then
            lead=${cur:0:i+1}
            break
        fi
    done
    [[ -n $lead ]] || return 0
    for i in "${!COMPREPLY[@]}"; do
        COMPREPLY[i]=${COMPREPLY[i]#"$lead"}
    done
}

complete -F _lease lease
