#!/usr/bin/env python3
"""Stored bytes of tessera.io VolumeAttachments per ticket, for docs/scaling-tickets.md.

Writes objects the way Tessera writes them (tickets in merge patches of 50 by field
manager tessera-csi-controller, as the CSI driver's grouped writes do; statuses by one
server-side apply of tessera-controller, satisfied tickets as the controller writes
them now: id, satisfied, generation, requestedAt, no condition; the status's node list
and its comma-separated copy), reads each back (`GET`, the JSON the API server stores
in etcd for a custom resource) and prints the object's bytes and those of its spec,
status and managedFields, per ticket, for:

  one        one VolumeAttachment holding N tickets (today's shape)
  pernode    one small object per (volume, node), each with its one ticket and status
             (the per-node attachment objects option), measured for one node and
             multiplied
  bare-spec  one VolumeAttachment holding N tickets, no status at all (the floor of
             any "compact status" shape: what spec and its managedFields cost)

Objects are named tbytes-*; no Tessera process may watch them (use a cluster of its
own: tests/harness/cluster.sh up). Usage: ticket_bytes.py KUBECONFIG [N,N,...]
(default 1,100,1000; the CRD caps a VolumeAttachment at 1,024 tickets).
The cluster's API server is on loopback with a throwaway CA: TLS is not verified.
"""
import base64, datetime, json, os, sys, tempfile, time
import requests, yaml

kc = yaml.safe_load(open(sys.argv[1]))
NS = [int(x) for x in (sys.argv[2] if len(sys.argv) > 2 else '1,100,1000').split(',')]
cl = kc['clusters'][0]['cluster']; us = kc['users'][0]['user']
d = tempfile.mkdtemp()
def f(name, b64):
    p = os.path.join(d, name); open(p, 'wb').write(base64.b64decode(b64)); return p
cert = (f('crt', us['client-certificate-data']), f('key', us['client-key-data']))
s = requests.Session(); s.verify = False; s.cert = cert; s.trust_env = False
import urllib3; urllib3.disable_warnings()
base = cl['server'] + '/apis/tessera.io/v1alpha1/volumeattachments'
now = lambda: datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%dT%H:%M:%SZ')
# csi-<sha256>, as the CSI driver names tickets; node names as kwok's (kwok-node-NNNN).
def tid(i): return 'csi-' + ('%064x' % (i * 0x9e3779b97f4a7c15 % (1 << 256)))
def node(i): return 'kwok-node-%04d' % i
def ticket(i):
    return {'id': tid(i), 'type': 'csi-attacher', 'nodeID': node(i),
            'parameters': {'readOnly': 'false'}, 'generation': 0}

def create(name, ids, with_status):
    s.delete(f'{base}/{name}')
    while s.get(f'{base}/{name}').status_code != 404: time.sleep(0.1)
    va = {'apiVersion': 'tessera.io/v1alpha1', 'kind': 'VolumeAttachment',
          'metadata': {'name': name}, 'spec': {'volume': name, 'attachmentTickets': {}}}
    s.post(base + '?fieldManager=tessera-controller', json=va).raise_for_status()
    for b in range(0, len(ids), 50):
        p = {'spec': {'attachmentTickets': {tid(i): ticket(i) for i in ids[b:b + 50]}}}
        s.patch(f'{base}/{name}?fieldManager=tessera-csi-controller', data=json.dumps(p),
                headers={'Content-Type': 'application/merge-patch+json'}).raise_for_status()
    if with_status:
        gen = s.get(f'{base}/{name}').json()['metadata']['generation']
        nodes = [node(i) for i in ids]
        st = {'attachmentTicketStatuses': {tid(i): {'id': tid(i), 'satisfied': True,
                                                    'generation': 0, 'requestedAt': now()}
                                           for i in ids},
              'ticketCount': len(ids), 'satisfiedCount': len(ids), 'nodes': nodes,
              'nodeList': ','.join(nodes), 'observedGeneration': gen,
              'conditions': [{'type': 'Ready', 'status': 'True', 'reason': 'TicketsSatisfied',
                              'message': 'every ticket is satisfied', 'observedGeneration': gen,
                              'lastTransitionTime': now()}]}
        body = {'apiVersion': 'tessera.io/v1alpha1', 'kind': 'VolumeAttachment',
                'metadata': {'name': name}, 'status': st}
        s.patch(f'{base}/{name}/status?fieldManager=tessera-controller&force=true',
                data=json.dumps(body),
                headers={'Content-Type': 'application/apply-patch+yaml'}).raise_for_status()
    r = s.get(f'{base}/{name}'); r.raise_for_status()
    o = r.json()
    size = lambda v: len(json.dumps(v, separators=(',', ':')))
    parts = {'object': len(r.content), 'spec': size(o.get('spec', {})),
             'status': size(o.get('status', {})),
             'managedFields': size(o['metadata'].get('managedFields', []))}
    s.delete(f'{base}/{name}')
    return parts

keys = []
for n in NS:
    ids = list(range(n))
    for shape, parts in [('one', create('tbytes-one', ids, True)),
                         ('bare-spec', create('tbytes-bare', ids, False))]:
        per = {k: v / n for k, v in parts.items()}
        print(f'{shape} N={n}: object {parts["object"]} B ({per["object"]:.0f} B/ticket: '
              f'spec {per["spec"]:.0f}, status {per["status"]:.0f}, '
              f'managedFields {per["managedFields"]:.0f})', flush=True)
        keys.append(f'{shape.replace("-", "_")}_n{n}_bytes={parts["object"]}')
        keys.append(f'{shape.replace("-", "_")}_n{n}_bytes_per_ticket={per["object"]:.0f}')
one = create('tbytes-pernode', [7], True)
print(f'pernode: one object of one ticket {one["object"]} B (spec {one["spec"]}, '
      f'status {one["status"]}, managedFields {one["managedFields"]})')
keys.append(f'pernode_object_bytes={one["object"]}')
print('BENCH ticket_bytes ' + ' '.join(keys))
