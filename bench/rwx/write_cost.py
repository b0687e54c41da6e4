#!/usr/bin/env python3
"""kube-apiserver + etcd CPU per write of one tessera.io VolumeAttachment with N tickets,
for three shapes of a satisfied ticket's status (bench/rwx/README.md, "Many nodes, one RWX
volume"):

  full  the Satisfied condition with its message and observedGeneration (before 2026-12-02)
  lean  the condition with an empty message and no observedGeneration
  bare  no condition: satisfied, generation, requestedAt (what the controller writes now)

For each shape and round: a VolumeAttachment with N tickets (written in merge patches
of 50 by field manager tessera-csi-controller, as the CSI driver's grouped writes do)
and one status apply (tessera-controller); then WRITES status applies (each after a
GET for the generation, as the controller's cache would have it) and WRITES ticket
merge patches (one ticket added, the previous one removed). CPU is the API server's
and etcd's own (utime + stime from /proc), so the figure is per write, whatever else
runs. Shapes are interleaved round by round. No Tessera process may watch these
objects (names shape-*; run it on a cluster of its own: tests/harness/cluster.sh up).

Usage: write_cost.py KUBECONFIG PIDS_DIR [N=500] [WRITES=20] [ROUNDS=3]
       (PIDS_DIR: target/cluster/pids of tests/harness/cluster.sh)
The cluster's API server is on loopback with a throwaway CA: TLS is not verified.
"""
import base64, json, os, sys, tempfile, time, datetime
import requests, yaml

kc = yaml.safe_load(open(sys.argv[1])); pids = sys.argv[2]
N = int(sys.argv[3]) if len(sys.argv) > 3 else 500
W = int(sys.argv[4]) if len(sys.argv) > 4 else 20
R = int(sys.argv[5]) if len(sys.argv) > 5 else 3
cl = kc['clusters'][0]['cluster']; us = kc['users'][0]['user']
d = tempfile.mkdtemp()
def f(name, b64):
    p = os.path.join(d, name); open(p, 'wb').write(base64.b64decode(b64)); return p
ca = f('ca', cl['certificate-authority-data'])
cert = (f('crt', us['client-certificate-data']), f('key', us['client-key-data']))
s = requests.Session(); s.verify = False; s.cert = cert; s.trust_env = False
import urllib3; urllib3.disable_warnings()
base = cl['server'] + '/apis/tessera.io/v1alpha1/volumeattachments'

def cpu():
    t = 0
    for c in ('kube-apiserver', 'etcd'):
        pid = open(f'{pids}/{c}.pid').read().strip()
        st = open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()
        t += int(st[11]) + int(st[12])
    return t / os.sysconf('SC_CLK_TCK')

def tid(i): return 'csi-' + ('%064x' % (i * 0x9e3779b97f4a7c15 % (1 << 256)))
now = lambda: datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%dT%H:%M:%SZ')

def ticket(i):
    return {'id': tid(i), 'type': 'csi-attacher', 'nodeID': 'node-%04d' % i,
            'parameters': {'readOnly': 'false'}, 'generation': 0}

def status(i, shape, gen):
    st = {'id': tid(i), 'satisfied': True, 'generation': 0, 'requestedAt': now()}
    c = {'type': 'Satisfied', 'status': 'True', 'reason': 'Attached',
         'message': 'attached to node-%04d, mount ready (read-write)' % i,
         'lastTransitionTime': now(), 'observedGeneration': gen}
    if shape == 'lean':
        c['message'] = ''; del c['observedGeneration']
    if shape != 'bare':
        st['conditions'] = [c]
    return st

def full_status(n, shape, gen, k):
    return {'apiVersion': 'tessera.io/v1alpha1', 'kind': 'VolumeAttachment',
            'metadata': {'name': name(shape)},
            'status': {'attachmentTicketStatuses': {tid(i): status(i, shape, gen) for i in range(n)},
                       'ticketCount': n, 'satisfiedCount': n - (k % 2), 'nodes': [],
                       'observedGeneration': gen}}

def name(shape): return 'shape-' + shape

def setup(shape):
    s.delete(f'{base}/{name(shape)}')
    while s.get(f'{base}/{name(shape)}').status_code != 404: time.sleep(0.1)
    va = {'apiVersion': 'tessera.io/v1alpha1', 'kind': 'VolumeAttachment',
          'metadata': {'name': name(shape)}, 'spec': {'volume': name(shape), 'attachmentTickets': {}}}
    r = s.post(base + '?fieldManager=bench', json=va); r.raise_for_status()
    # tickets in batches of 50 (the CSI driver's merge patches), then one status apply
    for b in range(0, N, 50):
        p = {'spec': {'attachmentTickets': {tid(i): ticket(i) for i in range(b, min(N, b + 50))}}}
        r = s.patch(f'{base}/{name(shape)}?fieldManager=tessera-csi-controller', data=json.dumps(p),
                    headers={'Content-Type': 'application/merge-patch+json'}); r.raise_for_status()
    apply_status(shape, 0)

def apply_status(shape, k):
    gen = s.get(f'{base}/{name(shape)}').json()['metadata']['generation']
    body = json.dumps(full_status(N, shape, gen, k))
    r = s.patch(f'{base}/{name(shape)}/status?fieldManager=tessera-controller&force=true', data=body,
                headers={'Content-Type': 'application/apply-patch+yaml'}); r.raise_for_status()
    return len(r.content)

def ticket_write(shape, k):
    i = N + k
    p = {'spec': {'attachmentTickets': {tid(i): ticket(i), tid(i - 1) if k else 'x': None}}}
    r = s.patch(f'{base}/{name(shape)}?fieldManager=tessera-csi-controller', data=json.dumps(p),
                headers={'Content-Type': 'application/merge-patch+json'}); r.raise_for_status()

shapes = ['full', 'lean', 'bare']
res = {sh: {'status': [], 'ticket': [], 'bytes': 0} for sh in shapes}
for rnd in range(R):
    for sh in shapes:
        setup(sh); time.sleep(0.5)
        c0 = cpu()
        for k in range(W): res[sh]['bytes'] = apply_status(sh, k + 1)
        c1 = cpu()
        for k in range(W): ticket_write(sh, k)
        c2 = cpu()
        # each status write includes one GET of the object (for its generation): subtract
        # nothing; the GET is the same for every shape in kind but not in size
        res[sh]['status'].append((c1 - c0) / W * 1000); res[sh]['ticket'].append((c2 - c1) / W * 1000)
        print(f'round {rnd} {sh}: status write+GET {res[sh]["status"][-1]:.1f} ms, '
              f'ticket write {res[sh]["ticket"][-1]:.1f} ms CPU, object {res[sh]["bytes"]/N:.0f} B/ticket', flush=True)
for sh in shapes:
    s.delete(f'{base}/{name(sh)}')
    med = lambda v: sorted(v)[len(v) // 2]
    print(f'{sh}: status {med(res[sh]["status"]):.1f} ms, ticket {med(res[sh]["ticket"]):.1f} ms, {res[sh]["bytes"]/N:.0f} B/ticket')
med = lambda v: sorted(v)[len(v) // 2]
print('BENCH rwx_write_cost n=%d writes=%d rounds=%d %s' % (N, W, R, ' '.join(
    f'{sh}_status_ms={med(res[sh]["status"]):.1f} {sh}_ticket_ms={med(res[sh]["ticket"]):.1f} '
    f'{sh}_bytes_per_ticket={res[sh]["bytes"] / N:.0f}' for sh in shapes)))
