// colibri-server's POST /v1/messages through the official Anthropic Node.js
// client, unchanged but for baseURL. Usage: node anthropic_test.mjs
// http://127.0.0.1:PORT API_KEY. Exits non-zero naming the failed check; run by
// tests/scripts/node_clients.sh.
import assert from 'node:assert/strict';
import Anthropic from '@anthropic-ai/sdk';
import { VERSION as clientVersion } from '@anthropic-ai/sdk/version';

import { checklist } from './checks.mjs';

const [base, apiKey] = process.argv.slice(2);
// The client sends the key as x-api-key. No retries: errors must show here.
const client = new Anthropic({ baseURL: base, apiKey, maxRetries: 0, timeout: 60_000 });

const { check, run } = checklist();

let model;
check('the served model is found through the OpenAI route', async () => {
  const response = await fetch(`${base}/v1/models`, { headers: { 'x-api-key': apiKey } });
  assert.equal(response.status, 200);
  model = (await response.json()).data[0].id;
});

const request = () => ({
  model,
  max_tokens: 24,
  system: 'You are terse.',
  messages: [{ role: 'user', content: 'Name three colours.' }],
});

check('messages.create: one text block, stop reason and usage', async () => {
  const message = await client.messages.create(request());
  assert.equal(message.type, 'message');
  assert.equal(message.role, 'assistant');
  assert.ok(message.id.startsWith('msg_'));
  assert.equal(message.content.length, 1);
  assert.equal(message.content[0].type, 'text');
  assert.ok(['end_turn', 'max_tokens'].includes(message.stop_reason));
  assert.ok(message.usage.input_tokens > 0);
  assert.ok(message.usage.output_tokens > 0 && message.usage.output_tokens <= 24);
});

check('countTokens gives the input tokens a request is charged', async () => {
  const { max_tokens: _, ...countable } = request();
  const counted = await client.messages.countTokens(countable);
  const message = await client.messages.create(request());
  assert.equal(counted.input_tokens, message.usage.input_tokens);
});

check('streamed events make up the same message', async () => {
  const whole = await client.messages.create(request());
  const stream = client.messages.stream(request());
  let text = '';
  stream.on('text', (delta) => { text += delta; });
  const final = await stream.finalMessage();
  assert.equal(text, whole.content[0].text);
  assert.equal(final.content[0].text, whole.content[0].text);
  assert.equal(final.stop_reason, whole.stop_reason);
  assert.equal(final.usage.output_tokens, whole.usage.output_tokens);
});

check('a stop sequence is reported as such', async () => {
  const whole = await client.messages.create(request());
  const text = whole.content[0].text;
  // A stop string from the greedy text (the same output again, cut before it).
  const at = [...text].findIndex((c, i) => i > 0 && /[a-z]/i.test(c));
  if (at < 0) return;
  const stop = [...text].slice(at, at + 1).join('');
  const stopped = await client.messages.create({ ...request(), stop_sequences: [stop] });
  assert.equal(stopped.stop_reason, 'stop_sequence');
  assert.equal(stopped.stop_sequence, stop);
  assert.ok(!stopped.content[0].text.includes(stop));
});

check('errors arrive as the client\'s typed errors', async () => {
  await assert.rejects(client.messages.create({ ...request(), max_tokens: 0 }),
    (e) => e instanceof Anthropic.BadRequestError && e.status === 400);
  await assert.rejects(client.messages.create({ ...request(), model: 'no-such-model' }),
    (e) => e instanceof Anthropic.NotFoundError && e.status === 404);
  const stranger = new Anthropic({ baseURL: base, apiKey: 'wrong-key', maxRetries: 0 });
  await assert.rejects(stranger.messages.create(request()),
    (e) => e instanceof Anthropic.AuthenticationError && e.status === 401);
  await assert.rejects(client.messages.create({ ...request(), tools: [{ name: 't', input_schema: { type: 'object' } }] }),
    (e) => e instanceof Anthropic.BadRequestError && /tool/.test(e.message));
});

await run(`@anthropic-ai/sdk ${clientVersion}`);
