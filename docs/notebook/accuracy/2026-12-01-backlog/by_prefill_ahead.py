"""TTFT error of the served predictions over the mixed phase's last 500, split by what the
state at dispatch said: prompts in prefill ahead (uncached_tokens_in_flight > 0) or not."""
import json, sys
for path in sys.argv[1:]:
    rows = []
    for l in open(path):
        d = json.loads(l); o = d['observation']
        if d['phase'] != 'mixed' or o['status'] != 200 or not o['request'].get('streaming'): continue
        if not o.get('ttft_ms') or not o.get('predicted_ttft_ms'): continue
        s = o.get('state_at_dispatch') or {}
        rows.append((s.get('uncached_tokens_in_flight', 0), s.get('prefill_backlog_tokens'), o['ttft_ms'], o['predicted_ttft_ms']))
    rows = rows[-500:]
    ape = lambda sub: (sum(abs(p - a) / a for *_, a, p in sub) / len(sub), len(sub)) if sub else (float('nan'), 0)
    ahead = [r for r in rows if r[0] > 0]; none = [r for r in rows if r[0] == 0]
    print(path, 'all %.1f%% (%d)' % (ape(rows)[0] * 100, len(rows)),
          '| prefill ahead %.1f%% (%d)' % (ape(ahead)[0] * 100, len(ahead)),
          '| none ahead %.1f%% (%d)' % (ape(none)[0] * 100, len(none)))
    if any(r[1] is not None for r in rows):
        left = [r for r in ahead if (r[1] or 0) > 0]; drained = [r for r in ahead if (r[1] or 0) == 0]
        print('   of those ahead: backlog left %.1f%% (%d) | drained %.1f%% (%d)' % (ape(left)[0]*100, len(left), ape(drained)[0]*100, len(drained)))
