# scripts/tls.sh — test certificates for the secured Kafka and Redis; sourced, not run.
#
# make_test_certs DIR writes, with openssl, when missing or expiring within a
# day (or signed by a CA that is not the one in DIR):
#
#   DIR/ca.pem, ca.key          a private test CA (the file clients trust)
#   DIR/server.crt, server.key  the server's certificate for 127.0.0.1 and
#                               localhost (subjectAltName), signed by the CA
#   DIR/client.crt, client.key  a client certificate (CN sluice-client) for
#                               mTLS, signed by the CA
#
# Keys are unencrypted RSA 2048 in PKCS#8 PEM, readable by the owner only.
# The caller defines log and die.

make_test_certs() {
  local dir="$1"
  command -v openssl >/dev/null || die "openssl is missing: it is needed to make the test certificates (apt-get install -y openssl)"
  if certs_fresh "$dir"; then
    return 0
  fi
  log "making test certificates in $dir"
  mkdir -p "$dir"
  chmod 700 "$dir"
  (
    set -e
    umask 077
    cd "$dir"
    rm -f ca.pem ca.key server.crt server.key client.crt client.key ./*.csr ./*.ext
    openssl req -x509 -new -newkey rsa:2048 -nodes -sha256 -days 825 \
      -keyout ca.key -out ca.pem -subj "/CN=sluice test CA" \
      -addext "basicConstraints=critical,CA:TRUE" \
      -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
    sign_test_cert server "localhost" \
      "subjectAltName=IP:127.0.0.1,DNS:localhost" "extendedKeyUsage=serverAuth,clientAuth"
    sign_test_cert client "sluice-client" "extendedKeyUsage=clientAuth"
    chmod 644 ca.pem server.crt client.crt
  ) || die "openssl could not make the test certificates in $dir"
}

# sign_test_cert NAME CN EXT... makes NAME.key and NAME.crt, signed by the CA
# in the current folder, with the given x509v3 extension lines.
sign_test_cert() {
  local name="$1" cn="$2"
  shift 2
  {
    echo "basicConstraints=CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    printf '%s\n' "$@"
  } >"$name.ext"
  openssl req -new -newkey rsa:2048 -nodes -sha256 -keyout "$name.key" -out "$name.csr" -subj "/CN=$cn" 2>/dev/null
  openssl x509 -req -sha256 -days 825 -in "$name.csr" -CA ca.pem -CAkey ca.key \
    -set_serial "0x$(openssl rand -hex 16)" -extfile "$name.ext" -out "$name.crt" 2>/dev/null
  rm -f "$name.csr" "$name.ext"
}

# certs_fresh DIR succeeds when every file is there, valid for another day,
# and the certificates verify against DIR's CA.
certs_fresh() {
  local dir="$1" f
  for f in ca.pem ca.key server.crt server.key client.crt client.key; do
    [[ -s "$dir/$f" ]] || return 1
  done
  for f in ca.pem server.crt client.crt; do
    openssl x509 -checkend 86400 -noout -in "$dir/$f" >/dev/null 2>&1 || return 1
  done
  openssl verify -CAfile "$dir/ca.pem" "$dir/server.crt" "$dir/client.crt" >/dev/null 2>&1
}
