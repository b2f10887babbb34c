#!/usr/bin/env sh
# The fleet's secrets, generated on the machine that deploys it; no secret ships in the repository.
#   sh deploy/secrets.sh        (from anywhere; run it once, before `compose up` or `kubectl apply -k`)
# writes deploy/secrets.env (compose's env_file) and deploy/kubernetes/secrets.env (read by kustomization.yaml's
# secretGenerator into the Secret morphguard-secrets), readable by their owner only. A file already there is kept:
# delete it to generate new values (then restart every process of the fleet: they must share one fleet key).
# Your provider's and judge's keys are taken from MORPHGUARD_UPSTREAM_API_KEY and MORPHGUARD_JUDGE_API_KEY when
# set; the trial's scripted upstream accepts any key, so it gets a random one.
set -eu
here="$(cd "$(dirname "$0")" && pwd)"
random() { od -An -N32 -tx1 /dev/urandom | tr -d ' \n'; }  # 256 bits, hex: safe in URLs and shell words

write() {
    if [ -e "$1" ]; then
        echo "kept $1 (delete it to generate new secrets)"
        return
    fi
    postgres="$(random)"
    umask 077
    cat > "$1" <<EOF
PGPASSWORD=$postgres
POSTGRES_PASSWORD=$postgres
REDIS_PASSWORD=$(random)
MORPHGUARD_FLEET_KEY=$(random)
MORPHGUARD_REVIEW_SECRET=$(random)
MORPHGUARD_REVIEW_KEY=$(random)
MORPHGUARD_PROXY_KEY=$(random)
MORPHGUARD_UPSTREAM_API_KEY=${MORPHGUARD_UPSTREAM_API_KEY:-$(random)}
MORPHGUARD_JUDGE_API_KEY=${MORPHGUARD_JUDGE_API_KEY:-}
EOF
    echo "wrote $1"
}

write "$here/secrets.env"
write "$here/kubernetes/secrets.env"
