# kill -9 of the DaemonSet's manager under traffic loses none of it (sourced by checks).
A=$CK_NS_A B=$CK_NS_B
kc apply -f - >/dev/null <<EOT
apiVersion: v1
kind: Pod
metadata: {name: loader, namespace: $B, labels: {role: loader}}
spec:
$(ck_pin)
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: $AGNHOST_IMAGE
    command: [/bin/sh, -c]
    args: ['while :; do if curl -s -m 1 -o /dev/null http://$WEB_IP:8080/hostname; then echo ok; else echo FAIL; fi; sleep 0.1; done']
EOT
kc -n "$B" wait --for=condition=Ready pod/loader --timeout=60s >/dev/null
requests() { kc -n "$B" logs loader | grep -c "$1"; }
some_ok() { [ "$(requests '^ok$')" -gt 5 ]; }
check "the loader's requests to web:8080 succeed (control)" eventually 20 some_ok

pids=$(manager_pids)
restarts=$(weft_restarts)
before_fail=$(requests '^FAIL$')
if [ "$(wc -w <<<"$pids")" = 1 ]; then
  kill -9 "$pids"
  ck_pass "kill -9 of weft-manager (pid $pids)"
else
  ck_fail "kill -9 of weft-manager: expected one manager process, found: ${pids:-none}"
fi
restarted() { [ "$(weft_restarts)" -gt "$restarts" ]; }
check "the kubelet restarts the manager's container" eventually 60 restarted
check "the restarted manager is ready" eventually 60 weft_ready
sleep 3
total=$(requests '.')
fails=$(( $(requests '^FAIL$') - before_fail ))
check "no request failed across the kill and the restart ($total requests in all)" test "$fails" = 0
check "the restarted manager still has web's endpoint" eventually 10 endpoint_of "$A" web
check "a new connection after the restart: $B/client reaches web:8080" reaches "$B" client "$WEB_IP" 8080
kc -n "$B" delete pod loader --wait=false >/dev/null
