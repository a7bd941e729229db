// colibri-server through the official OpenAI Node.js client, unchanged but for
// baseURL: what "existing OpenAI clients work" means for the people calling it.
// Usage: node client_test.mjs http://127.0.0.1:PORT API_KEY
// Exits non-zero with the failed check's name; run by tests/scripts/openai_node_client.sh.
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { VERSION as clientVersion } from 'openai/version';

import { checklist } from './checks.mjs';

const [base, apiKey] = process.argv.slice(2);
// No retries: a 429 or 5xx must show here, not be hidden by the client.
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey, maxRetries: 0, timeout: 60_000 });

const { check, run } = checklist();

let model;
check('models.list names the served model', async () => {
  const page = await client.models.list();
  assert.equal(page.data.length, 1);
  model = page.data[0].id;
  assert.equal(page.data[0].object, 'model');
  const one = await client.models.retrieve(model);
  assert.equal(one.id, model);
});

const prompt = 'The quick brown fox';
check('completions: streamed text and tokens equal the whole response', async () => {
  const whole = await client.completions.create({ model, prompt, max_tokens: 12, temperature: 0 });
  assert.equal(whole.object, 'text_completion');
  assert.ok(['stop', 'length'].includes(whole.choices[0].finish_reason));
  assert.ok(whole.usage.completion_tokens > 0);
  assert.equal(whole.usage.total_tokens, whole.usage.prompt_tokens + whole.usage.completion_tokens);
  const stream = await client.completions.create({
    model, prompt, max_tokens: 12, temperature: 0, stream: true, stream_options: { include_usage: true },
  });
  let text = '';
  let finish = null;
  let usage = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const choice of chunk.choices) {
      text += choice.text;
      if (choice.finish_reason) finish = choice.finish_reason;
    }
  }
  assert.equal(text, whole.choices[0].text);
  assert.equal(finish, whole.choices[0].finish_reason);
  assert.deepEqual(usage, whole.usage);
});

const messages = [{ role: 'system', content: 'You are terse.' }, { role: 'user', content: 'Name three colours.' }];
check('chat: streamed deltas equal the whole message', async () => {
  const whole = await client.chat.completions.create({ model, messages, max_tokens: 16 });
  assert.equal(whole.object, 'chat.completion');
  assert.equal(whole.choices[0].message.role, 'assistant');
  const stream = await client.chat.completions.create({ model, messages, max_tokens: 16, stream: true });
  let content = '';
  let role = null;
  for await (const chunk of stream) {
    assert.equal(chunk.object, 'chat.completion.chunk');
    const delta = chunk.choices[0]?.delta ?? {};
    if (delta.role) role = delta.role;
    content += delta.content ?? '';
  }
  assert.equal(role, 'assistant');
  assert.equal(content, whole.choices[0].message.content);
});

check('chat: logprobs with alternatives, in a stream too', async () => {
  const request = { model, messages, max_tokens: 8, logprobs: true, top_logprobs: 3 };
  const whole = await client.chat.completions.create(request);
  const content = whole.choices[0].logprobs.content;
  assert.ok(content.length > 0 && content.length <= whole.usage.completion_tokens);
  for (const entry of content) {
    assert.ok(entry.logprob <= 0);
    assert.equal(entry.top_logprobs.length, 3);
    assert.deepEqual(entry.top_logprobs[0].bytes, entry.bytes);  // greedy: the most likely token
  }
  const joined = Buffer.concat(content.map((e) => Buffer.from(e.bytes))).toString('utf8');
  assert.equal(joined, whole.choices[0].message.content);
  const streamed = [];
  for await (const chunk of await client.chat.completions.create({ ...request, stream: true }))
    streamed.push(...(chunk.choices[0]?.logprobs?.content ?? []));
  assert.deepEqual(streamed, content);
});

check('completions: logprobs in the legacy shape', async () => {
  const whole = await client.completions.create({ model, prompt, max_tokens: 6, logprobs: 2, temperature: 0 });
  const lp = whole.choices[0].logprobs;
  assert.equal(lp.tokens.length, lp.token_logprobs.length);
  assert.equal(lp.tokens.join(''), whole.choices[0].text);
  assert.equal(lp.text_offset[0], 0);
  for (const top of lp.top_logprobs) assert.ok(Object.keys(top).length >= 1 && Object.keys(top).length <= 2);
});

check('completions: echo with logprobs scores the prompt (max_tokens 0)', async () => {
  const scored = await client.completions.create({ model, prompt, max_tokens: 0, echo: true, logprobs: 1 });
  const choice = scored.choices[0];
  assert.equal(choice.text, prompt);
  assert.equal(choice.logprobs.token_logprobs[0], null);
  assert.equal(choice.logprobs.tokens.length, scored.usage.prompt_tokens);
  assert.ok(choice.logprobs.token_logprobs.slice(1).every((lp) => lp <= 0));
  assert.equal(scored.usage.completion_tokens, 0);
});

check('chat: response_format json_object keeps the reply JSON', async () => {
  const reply = await client.chat.completions.create({
    model, messages, max_tokens: 40, temperature: 1, seed: 3, response_format: { type: 'json_object' },
  });
  const { content } = reply.choices[0].message;
  assert.ok(content.startsWith('{'), content);
  if (reply.choices[0].finish_reason === 'stop') assert.equal(typeof JSON.parse(content), 'object');
});

// The client's error classes come from the status; the body's param and code reach it.
async function expectError(promise, Kind, status, param) {
  try {
    await promise;
  } catch (error) {
    assert.ok(error instanceof Kind, `expected ${Kind.name}, got ${error.constructor.name}: ${error.message}`);
    assert.equal(error.status, status);
    if (param !== undefined) assert.equal(error.param, param);
    assert.ok(error.message.length > 0);
    return error;
  }
  assert.fail(`expected ${Kind.name}`);
}

check('errors arrive as the client\'s typed errors', async () => {
  await expectError(client.chat.completions.create({ model, messages, n: 2 }), OpenAI.BadRequestError, 400, 'n');
  await expectError(client.completions.create({ model, prompt, temperature: -1 }), OpenAI.BadRequestError, 400, 'temperature');
  await expectError(client.completions.create({ model, prompt, logprobs: 50 }), OpenAI.BadRequestError, 400, 'logprobs');
  await expectError(client.completions.create({ model: 'no-such-model', prompt }), OpenAI.NotFoundError, 404);
  const stranger = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'wrong-key', maxRetries: 0 });
  await expectError(stranger.models.list(), OpenAI.AuthenticationError, 401);
  // A streamed request is validated before its first byte: a plain error, not a broken stream.
  await expectError(client.chat.completions.create({ model, messages, max_tokens: 0, stream: true }), OpenAI.BadRequestError, 400, 'max_tokens');
});

await run(`openai ${clientVersion}`);
