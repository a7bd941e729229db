// Cross-check of the Python BPE encoder against the JS Hugging Face tokenizer
// (npm package @huggingface/tokenizers, installed OUTSIDE the repo, e.g.
//   cd /tmp/train-data && npm install @huggingface/tokenizers ).
//
// usage: node check_tokenizer.mjs <node_modules dir> <model dir> <cases.json>
// cases.json: [{"text": "...", "ids": [python ids]}, ...] (written by check_tokenizer.py).
// Prints a summary line "N passed, M failed" and exits non-zero on any mismatch.
import { createRequire } from "node:module";
import fs from "node:fs";
import path from "node:path";

const [nodeModules, modelDir, casesFile] = process.argv.slice(2);
const require = createRequire(path.join(path.resolve(nodeModules), "noop.js"));
const { Tokenizer } = require("@huggingface/tokenizers");

const tj = JSON.parse(fs.readFileSync(path.join(modelDir, "tokenizer.json"), "utf8"));
const tc = JSON.parse(fs.readFileSync(path.join(modelDir, "tokenizer_config.json"), "utf8"));
const tok = new Tokenizer(tj, tc);
const cases = JSON.parse(fs.readFileSync(casesFile, "utf8"));

let pass = 0, fail = 0, ntok = 0, decodeFail = 0;
for (const c of cases) {
  const ids = tok.encode(c.text, { add_special_tokens: false }).ids.map(Number);
  ntok += ids.length;
  const same = ids.length === c.ids.length && ids.every((v, i) => v === c.ids[i]);
  if (same) pass++;
  else {
    fail++;
    if (fail <= 5) {
      console.log("MISMATCH text:", JSON.stringify(c.text));
      console.log("  python:", JSON.stringify(c.ids));
      console.log("  js    :", JSON.stringify(ids));
    }
  }
  const dec = c.ids.length ? tok.decode(c.ids, { skip_special_tokens: false }) : "";
  if (dec !== c.text) {
    decodeFail++;
    if (decodeFail <= 3) console.log("DECODE differs:", JSON.stringify(c.text), "->", JSON.stringify(dec));
  }
}
console.log(`cases ${cases.length}, tokens ${ntok}, decode round-trip failures ${decodeFail}`);
console.log(`${pass} passed, ${fail} failed`);
process.exit(fail === 0 && decodeFail === 0 ? 0 : 1);
