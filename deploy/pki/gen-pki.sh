#!/bin/sh
# Make a throwaway PKI for trying Serentak (compose's one-shot `pki` service runs this; run
# it by hand for Kubernetes or hosts, docs/deploy-replicated.md): a CA; etcd member
# certificates (server + peer); server/client certificates for upload, locks and notify
# (mTLS between them); an etcd client certificate for locks; an RS256 key with its JWKS
# (public/jwks.json), tokens for demo users and each service; and by-service/NAME/, the part
# of it each container mounts.
#
#   sh deploy/pki/gen-pki.sh OUT_DIR      (POSIX sh + openssl; idempotent: keeps an existing CA)
#   sh deploy/pki/gen-pki.sh OUT_DIR user NAME TENANT [ROLES]
#                                         a token for one more user, tokens/NAME.jwt, signed by
#                                         OUT_DIR's JWT key (ROLES: comma list, e.g. ops)
#
# Env: NAMESPACE (Kubernetes namespace for the service DNS names, default serentak),
# SERVICE_DOMAIN (default serentak.internal: every upload/locks/notify certificate carries
# SERVICE.SERVICE_DOMAIN, the name a client verifies when it dials a list of replicas' IPs,
# SERENTAK_{UPLOAD,LOCKS,NOTIFY}_TLS_SERVER_NAME), REPLICAS (e.g. "1 2": also a certificate
# and key per replica, SERVICE-N.pem, each with its own name and the shared ones),
# ETCD_MEMBERS (default "etcd-1 etcd-2 etcd-3"; NAME=HOST also puts HOST, an IP or a DNS
# name, on that member's certificate: the address its peers and clients dial), JWT_ISSUER,
# JWT_AUDIENCE, DAYS.
# Production: use your own CA and identity provider; these keys sit in plain files.
set -eu

OUT=${1:?usage: gen-pki.sh OUT_DIR [user NAME TENANT [ROLES]]}
MODE=${2:-all}
NAMESPACE=${NAMESPACE:-serentak}
SERVICE_DOMAIN=${SERVICE_DOMAIN:-serentak.internal}
REPLICAS=${REPLICAS:-}
ETCD_MEMBERS=${ETCD_MEMBERS:-"etcd-1 etcd-2 etcd-3"}
JWT_ISSUER=${JWT_ISSUER:-https://pki.serentak.local}
JWT_AUDIENCE=${JWT_AUDIENCE:-serentak}
DAYS=${DAYS:-365}
mkdir -p "$OUT/tokens"
umask 077
cd "$OUT"

# --- JWT: an RS256 key, its JWKS, and tokens -------------------------------------------
b64url() { openssl base64 -A | tr '+/' '-_' | tr -d '='; }
if [ "$MODE" = all ] && [ ! -f jwt-key.pem ]; then
  openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out jwt-key.pem 2>/dev/null
fi
[ -f jwt-key.pem ] || { echo "no $OUT/jwt-key.pem: run gen-pki.sh $OUT first" >&2; exit 1; }
# The modulus of a 2048-bit key sits at bytes 33..288 of its DER SubjectPublicKeyInfo.
N=$(openssl pkey -in jwt-key.pem -pubout -outform DER | dd bs=1 skip=33 count=256 2>/dev/null | b64url)
KID=$(printf '%s' "$N" | openssl dgst -sha256 -binary | b64url | cut -c1-16)

# token FILE CLAIMS_JSON_FRAGMENT: an RS256 JWT valid for DAYS days.
token() {
  now=$(date +%s)
  header=$(printf '{"alg":"RS256","typ":"JWT","kid":"%s"}' "$KID" | b64url)
  payload=$(printf '{"iss":"%s","aud":"%s","iat":%s,"nbf":%s,"exp":%s,%s}' \
    "$JWT_ISSUER" "$JWT_AUDIENCE" "$now" "$now" "$((now + DAYS * 86400))" "$2" | b64url)
  signature=$(printf '%s.%s' "$header" "$payload" | openssl dgst -sha256 -sign jwt-key.pem | b64url)
  printf '%s.%s.%s\n' "$header" "$payload" "$signature" > "tokens/$1"
}

if [ "$MODE" = user ]; then
  NAME=${3:?usage: gen-pki.sh OUT_DIR user NAME TENANT [ROLES]}
  TENANT=${4:?usage: gen-pki.sh OUT_DIR user NAME TENANT [ROLES]}
  case "$NAME$TENANT" in *[!A-Za-z0-9._@-]*) echo "NAME and TENANT: letters, digits, . _ @ -" >&2; exit 1;; esac
  # ROLES "a,b" -> ["a","b"] (role names are checked like NAME above).
  case "${5:-}" in *[!A-Za-z0-9._,-]*) echo "ROLES: a comma list of names" >&2; exit 1;; esac
  roles=$(printf '%s' "${5:-}" | sed 's/[^,][^,]*/"&"/g')
  token "$NAME.jwt" "\"sub\":\"$NAME\",\"tenant_id\":\"$TENANT\",\"roles\":[$roles]"
  chmod 0600 "tokens/$NAME.jwt"
  echo "token for $NAME ($TENANT) in $OUT/tokens/$NAME.jwt"
  exit 0
elif [ "$MODE" != all ]; then
  echo "usage: gen-pki.sh OUT_DIR [user NAME TENANT [ROLES]]" >&2; exit 2
fi

if [ ! -f ca.pem ]; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout ca-key.pem \
    -out ca.pem -days "$DAYS" \
    -subj "/CN=serentak-dev-ca" -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
fi

# cert NAME SANS: a key and a certificate for both server and client use, signed by the CA.
# ECDSA P-256 keys: made in milliseconds where RSA takes a second under load.
cert() {
  printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\nkeyUsage=critical,digitalSignature\n' "$2" > "$1.ext"
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$1-key.pem" \
    -out "$1.csr" -subj "/CN=$1" 2>/dev/null
  openssl x509 -req -in "$1.csr" -CA ca.pem -CAkey ca-key.pem -CAcreateserial -days "$DAYS" \
    -extfile "$1.ext" -out "$1.pem" 2>/dev/null
  rm -f "$1.csr" "$1.ext"
}

openssl pkey -in jwt-key.pem -pubout -out jwt-pub.pem
# public/: what may be served to anyone (the JWKS endpoint serves only this folder).
mkdir -p public
printf '{"keys":[{"kty":"RSA","use":"sig","alg":"RS256","kid":"%s","n":"%s","e":"AQAB"}]}\n' \
  "$KID" "$N" > public/jwks.json
cp ca.pem public/ca.pem

members=""
for entry in $ETCD_MEMBERS; do
  member=${entry%%=*}
  members="$members $member"
  extra=""
  if [ "$member" != "$entry" ]; then
    host=${entry#*=}
    case $host in
      *:*) kind=IP ;;  # IPv6
      *[!0-9.]*) kind=DNS ;;
      *) kind=IP ;;
    esac
    extra=",$kind:$host"
  fi
  cert "$member" "DNS:$member,DNS:$member.etcd,DNS:$member.etcd.$NAMESPACE.svc,DNS:$member.etcd.$NAMESPACE.svc.cluster.local,DNS:localhost,IP:127.0.0.1$extra"
done
cert etcd-client "DNS:etcd-client"
for service in upload locks notify; do
  # The names every replica of the service answers to (shared: one Service, one list).
  shared="DNS:$service,DNS:$service.$SERVICE_DOMAIN,DNS:$service.$NAMESPACE.svc,DNS:$service.$NAMESPACE.svc.cluster.local,DNS:$service-headless,DNS:$service-headless.$NAMESPACE.svc"
  cert "$service" "$shared,DNS:localhost,IP:127.0.0.1"
  for n in $REPLICAS; do
    cert "$service-$n" "DNS:$service-$n,DNS:$service-$n.$SERVICE_DOMAIN,$shared,DNS:localhost,IP:127.0.0.1"
  done
done

token alice.jwt '"sub":"alice","tenant_id":"acme","roles":[]'
token bob.jwt '"sub":"bob","tenant_id":"acme","roles":[]'
for service in upload locks notify ops; do
  token "$service.jwt" "\"sub\":\"serentak-$service\",\"client_id\":\"serentak-$service\""
done

# Certificates, the JWKS and tokens readable by all; private keys only by their owner: the
# services' non-root user (uid 10001) when run as root (compose's init), else the caller.
# The CA and JWT signing keys never leave this directory.
chmod 0755 . tokens public
chmod 0644 ./*.pem public/* tokens/*
chmod 0600 ./*-key.pem tokens/*
if [ "$(id -u)" = 0 ]; then
  chown 10001:10001 ./*-key.pem tokens/*
  chown 0:0 ca-key.pem jwt-key.pem
fi
# by-service/NAME/: all one container may read (compose mounts it as /pki with a volume
# subpath): the CA, its own certificate and key, its token; never another's key.
bundle() {
  dir="by-service/$1"; shift
  rm -rf "$dir"; mkdir -p "$dir/tokens"
  cp -p ca.pem "$dir/"
  for f in "$@"; do cp -p "$f" "$dir/$f"; done
}
for member in $members; do bundle "$member" "$member.pem" "$member-key.pem"; done
bundle upload upload.pem upload-key.pem tokens/upload.jwt
bundle locks locks.pem locks-key.pem tokens/locks.jwt etcd-client.pem etcd-client-key.pem
bundle notify notify.pem notify-key.pem tokens/notify.jwt
chmod 0755 by-service by-service/* by-service/*/tokens
echo "PKI in $OUT: ca.pem, etcd-*, upload/locks/notify certificates (each also names" \
  "SERVICE.$SERVICE_DOMAIN), public/jwks.json, tokens/"
