#!/usr/bin/env python3
"""Writes tests/data/tokenizer/corpus.jsonl: the strings on which our tokenizer must produce exactly the
ids of the Hugging Face `tokenizers` library (see tools/make_tokenizer_goldens.py and docs/tokenizer.md).

Deterministic (fixed seed, no clock, no environment), plain python3, no third-party modules. Every
string is written here or generated from word lists written here; nothing is copied from other texts.

One JSON object per line:
  {"tag": CATEGORY, "text": STRING}                 the string to tokenize
  {"tag": "invalid_utf8", "raw_hex": HEX, "text": STRING}
      raw_hex holds bytes that are not valid UTF-8; text is bytes.decode("utf-8", errors="replace"),
      which is what the reference tokenizes (a Python str cannot hold invalid UTF-8). Our C++ tokenizer
      is fed the raw bytes and must give the ids of text, because it replaces each maximal invalid
      subpart with U+FFFD exactly as Python's decoder does.

Usage: tools/make_tokenizer_corpus.py [--out tests/data/tokenizer/corpus.jsonl]
"""
import argparse
import json
import os
import random

SEED = 20261130

# Short everyday words per script, typed for this corpus. Enough variety to reach many merges.
WORDS = {
    "english": "the quick brown fox jumps over lazy dog time people year way day thing man world life hand part "
               "child eye woman place work week case point number group problem fact house water room mother "
               "area money story month lot right study book job word business issue side kind head service "
               "friend father power hour game line end member law car city community name president team "
               "minute idea kid body information back parent face others level office door health person art "
               "war history party result change morning reason research girl guy moment air teacher force "
               "education don't can't won't it's I'm you're we've they'll she'd He's THEY'RE I'LL".split(),
    "german": "und der die das ist nicht ein eine Straße Mädchen über schön Größe fünf Bücher Käse müssen "
              "Donaudampfschifffahrt Zusammenarbeit Übersetzung Grüße".split(),
    "french": "le la les et est une où été très déjà garçon français naïve cœur œuvre Noël façade élève "
              "hôpital forêt crème brûlée".split(),
    "spanish": "el la los niño año señor mañana corazón canción ¿qué ¡hola! pingüino árbol están".split(),
    "turkish": "ve bir bu ağaç çocuk ışık İstanbul güzel şehir öğrenci Iğdır".split(),
    "vietnamese": "Tiếng Việt xin chào cảm ơn người nước phở đường thành phố Hà Nội".split(),
    "polish": "zażółć gęślą jaźń źdźbło chrząszcz Łódź szczęście".split(),
    "russian": "и в не на я быть он с что а по это она этот к но они мы как из у который то за свой "
               "Москва привет спасибо хорошо сегодня завтра вчера Ёлка ёжик щука объём".split(),
    "ukrainian": "привіт дякую їжак ґанок Київ українська".split(),
    "greek": "και το η ο της των είναι Αθήνα καλημέρα ευχαριστώ θάλασσα ψυχή ΩΡΑΙΟ ΆΣΤΡΟ ς".split(),
    "arabic": "في من على إلى أن هذا كان مرحبا شكرا السلام عليكم كتاب مدرسة القاهرة اللغة العربية".split(),
    "hebrew": "של את על זה שלום תודה ירושלים ספר בית".split(),
    "hindi": "है का में की और को से नमस्ते धन्यवाद भारत हिन्दी किताब पानी विद्यालय क्षत्रिय".split(),
    "bengali": "আমি তুমি বাংলা ভাষা ধন্যবাদ".split(),
    "tamil": "வணக்கம் தமிழ் நன்றி".split(),
    "thai": "สวัสดี ขอบคุณ ภาษาไทย กรุงเทพมหานคร น้ำ ไฟ บ้าน โรงเรียน ครับ ค่ะ".split(),
    "georgian": "გამარჯობა მადლობა საქართველო".split(),
    "armenian": "բարեւ շնորհակալություն Հայաստան".split(),
    "amharic": "ሰላም አመሰግናለሁ ኢትዮጵያ".split(),
    "korean": "안녕하세요 감사합니다 한국어 서울 학교 사람 사랑 컴퓨터".split(),
}
# Languages written without spaces: strings of these are concatenated directly.
NO_SPACE = {
    "chinese": list("的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可她里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同三已老从动两长知民样现分将外但身些与高意进把法此实回二理美点月明其种声全工己话儿者向情部正名定女问力机给等几很业最间新什打便位因重被走电四第门相次东政海口使教西再平真听世气信北少关并内加化由却代军产入先山五太水万市眼体别处总才场师书比住员九笑性通目华报立马命张活难神数件安表原车白应路期叫死常提感金何更反合放做系计或司利受光王果亲界及今京务制解各任至清物台象记边共风战干接它许八特觉望直服毛林题建南度统色字请交爱让认算论百吃义科怎元社术结六功指思非流每青管夫连远资队跟带花快条院变联言权往展该领传近留红治决周保达办运武半候七必城父强步完革深区即求品士转量空甚众技轻程告江语英基派满式李息写呢识极令黄德收脸钱党倒未持取设始版双历越史商千片容研像找友孩站广改议形委早房音火际则首单据导影失拿网香似斯专石若兵弟谁校读志飞观争究包组造落视济喜离虽坏兴切敢"),
    "japanese": list("あいうえおかきくけこさしすせそたちつてとなにぬねのはひふへほまみむめもやゆよらりるれろわをんアイウエオカキクケコサシスセソタチツテトナニヌネノハヒフヘホマミムメモヤユヨラリルレロワヲンー日本語東京")
                + ["です", "ます", "ありがとう", "こんにちは", "カタカナ", "ひらがな", "漢字", "東京タワー"],
}

EMOJI = ["😀", "😂", "🥲", "❤️", "👍", "🎉", "🚀", "🔥", "✨", "🙏", "🤖", "🧠", "🍕", "🐍", "⚡", "☕",
         "👍🏻", "👍🏼", "👍🏽", "👍🏾", "👍🏿", "👋🏽", "🧑🏿‍💻", "👩‍💻", "👨‍👩‍👧‍👦", "👩‍❤️‍👨",
         "🏳️‍🌈", "🏴‍☠️", "🇫🇷", "🇯🇵", "🇺🇸", "🇧🇷", "1️⃣", "#️⃣", "©️", "™️", "🫠", "🫶🏾", "🧑‍🤝‍🧑",
         "👁️‍🗨️", "🐈‍⬛", "❤️‍🔥", "🤷‍♀️", "🤦🏼‍♂️"]

SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|begin_of_text|>", "<|end_of_text|>",
            "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>", "<|reserved_special_token_5|>",
            "<s>", "</s>", "<unk>", "<think>", "</think>", "<tool_call>", "</tool_call>",
            "<|fim_prefix|>", "<|vision_pad|>", "<tool_response>"]
# Near misses that must not match an added token.
NEAR_SPECIALS = ["<|im_start|", "<|im_start", "|im_start|>", "<|IM_START|>", "< s>", "<s >", "<|endoftext||>",
                 "<<s>>", "<|<|im_end|>|>", "<think", "think>", "<|begin_of_text"]

CODE = [
    'def add(a, b):\n    """Return the sum."""\n    return a + b\n',
    'for (int i = 0; i < n; ++i) {\n\tsum += v[i] * w[i];\n}\n',
    '#include <vector>\nint main() { std::vector<int> v{1, 2, 3}; return v.size() == 3 ? 0 : 1; }\n',
    'const f = async (x) => { await sleep(100); return x ?? null; };',
    'SELECT id, name FROM users WHERE age >= 18 AND name LIKE \'%an%\' ORDER BY id DESC;',
    '{"key": [1, 2.5, -3e10, true, null], "nested": {"a": "b\\n"}}',
    '<div class="row"><a href="https://example.org/path?q=1&r=2#frag">link</a></div>',
    'if [ -f "$HOME/.bashrc" ]; then\n  source "$HOME/.bashrc"\nfi\n',
    'fn main() -> Result<(), Box<dyn Error>> {\n    let x: u64 = 0xFFFF_FFFF;\n    Ok(())\n}\n',
    'x = [i**2 for i in range(10) if i % 2 == 0]  # squares of evens',
    '    \t  indented_with_mixed_whitespace = True\r\n',
    'matrix[i][j] += alpha * (a[i][k] - b[k][j]) / 2.0f;',
    'print(f"{name!r:>10} -> {value:.3f}")',
    'template <typename T> concept Number = std::integral<T> || std::floating_point<T>;',
    '$ git commit -m "fix: don\'t crash on empty input" && git push origin HEAD:refs/for/main',
    '/* block comment */ // line comment\n#define MAX(a,b) ((a)>(b)?(a):(b))',
    'a=1;b=2;c=a+b;d=c*c;e=d/(a-b);',
    'λx.λy.x y  ∀x∈ℝ: x² ≥ 0  ∑_{i=1}^{n} i = n(n+1)/2',
    '    return std::accumulate(v.begin(), v.end(), 0LL);\n',
    '||| &&& ::: ... ;;; ,,, !!! ??? ~~~ ``` ### $$$ %%% ^^^ *** ((( ))) [[[ ]]] {{{ }}}',
]

WHITESPACE = [" ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\r\n", "\r", "\r\n\r\n", " \n", "\n ", " \t \n",
              "\u00a0", "\u3000", "\u2009", "\u200b", "\u2028", "\u000b", "\u000c", "\u0085", "\u202f"]

PUNCT = [".", ",", "!", "?", ";", ":", "…", "—", "-", "'", "\"", "«", "»", "“", "”", "‘", "’", "(", ")",
         "、", "。", "！", "？", "،", "؟", "।"]


def pick_words(rng, lang, n):
    if lang in NO_SPACE:
        return "".join(rng.choice(NO_SPACE[lang]) for _ in range(n))
    return " ".join(rng.choice(WORDS[lang]) for _ in range(n))


def sentence(rng):
    lang = rng.choice(list(WORDS) + list(NO_SPACE))
    s = pick_words(rng, lang, rng.randint(1, 14))
    if rng.random() < 0.7:
        s += rng.choice(PUNCT)
    if rng.random() < 0.3:
        s = s[0].upper() + s[1:]
    return s


def number(rng):
    kind = rng.randrange(8)
    if kind == 0:
        return str(rng.randrange(10 ** rng.randint(1, 40)))
    if kind == 1:
        return f"{rng.uniform(-1e6, 1e6):.{rng.randint(0, 8)}f}"
    if kind == 2:
        return f"{rng.randrange(10**9):,}"
    if kind == 3:
        return "".join(chr(0x0660 + rng.randrange(10)) for _ in range(rng.randint(1, 8)))  # Arabic-Indic
    if kind == 4:
        return "".join(chr(0xFF10 + rng.randrange(10)) for _ in range(rng.randint(1, 8)))  # fullwidth
    if kind == 5:
        return "".join(chr(0x0966 + rng.randrange(10)) for _ in range(rng.randint(1, 6)))  # Devanagari
    if kind == 6:
        return rng.choice(["½", "¾", "²", "³", "Ⅻ", "①", "⁴²", "٣.١٤"]) + str(rng.randrange(100))
    return f"{rng.randrange(1, 13):02d}/{rng.randrange(1, 29):02d}/{rng.randrange(1900, 2100)} {rng.randrange(24):02d}:{rng.randrange(60):02d}"


# Code point ranges to draw random characters from: assigned blocks of many scripts plus controls,
# private use, noncharacters and astral planes, so the regex classes and byte fallback all get exercised.
RANGES = [(0x20, 0x7E), (0x00, 0x1F), (0x7F, 0x9F), (0xA0, 0x24F), (0x300, 0x36F), (0x370, 0x3FF),
          (0x400, 0x4FF), (0x590, 0x5FF), (0x600, 0x6FF), (0x900, 0x97F), (0xE00, 0xE7F), (0x1100, 0x11FF),
          (0x1E00, 0x1EFF), (0x2000, 0x206F), (0x20A0, 0x20CF), (0x2100, 0x214F), (0x2190, 0x23FF),
          (0x2500, 0x27BF), (0x3000, 0x30FF), (0x4E00, 0x9FFF), (0xAC00, 0xD7A3), (0xE000, 0xF8FF),
          (0xFB00, 0xFDFF), (0xFE00, 0xFE0F), (0xFE20, 0xFFFD), (0x10000, 0x1007F), (0x1D400, 0x1D7FF),
          (0x1F300, 0x1FAFF), (0x20000, 0x2A6DF), (0xE0000, 0xE007F), (0xF0000, 0xF00FF),
          (0x10FF00, 0x10FFFF)]


def random_char(rng):
    lo, hi = rng.choice(RANGES)
    return chr(rng.randint(lo, hi))  # no range reaches the surrogates, so every result is encodable


def random_mix(rng):
    parts = []
    for _ in range(rng.randint(1, 12)):
        r = rng.random()
        if r < 0.3:
            parts.append(sentence(rng))
        elif r < 0.4:
            parts.append(rng.choice(EMOJI))
        elif r < 0.5:
            parts.append(number(rng))
        elif r < 0.6:
            parts.append(rng.choice(WHITESPACE) * rng.randint(1, 4))
        elif r < 0.67:
            parts.append(rng.choice(SPECIALS))
        elif r < 0.7:
            parts.append(rng.choice(NEAR_SPECIALS))
        elif r < 0.75:
            parts.append(rng.choice(CODE)[: rng.randint(1, 60)])
        else:
            parts.append("".join(random_char(rng) for _ in range(rng.randint(1, 10))))
    sep = rng.choice(["", " ", "\n", " ", "  "])
    return sep.join(parts)


def combining(rng):
    base = rng.choice("aeiouAEIOUnNcCsSzZyYgGkKhHwWxX")
    marks = "".join(chr(rng.randint(0x300, 0x36F)) for _ in range(rng.randint(1, 6)))
    return base + marks


def invalid_utf8(rng):
    """Valid UTF-8 text with invalid byte sequences spliced in."""
    bad = [b"\xff", b"\xfe", b"\x80", b"\xbf", b"\xc0\xaf", b"\xc1\xbf", b"\xe0\x80\xaf", b"\xed\xa0\x80",
           b"\xed\xbf\xbf", b"\xf4\x90\x80\x80", b"\xf5\x80\x80\x80", b"\xf8\x88\x80\x80\x80",
           b"\xe2\x82", b"\xe2", b"\xf0\x9f\x98", b"\xf0\x9f", b"\xc3", b"\xc3\x28", b"\xe2\x28\xa1",
           b"\xf0\x28\x8c\x28", b"\x80\x80\x80", b"\xef\xbf\xbd\xff"]
    out = b""
    for _ in range(rng.randint(1, 6)):
        if rng.random() < 0.5:
            out += sentence(rng).encode()
        else:
            out += rng.choice(bad)
        if rng.random() < 0.3:
            out += b" "
    return out


def fixed_strings():
    """Hand-picked edge cases, each written once."""
    s = ["", " ", "  ", "\n", "\t", "\r\n", "a", "A", "0", "é", "e\u0301", "\ufffd", "\ufffd\ufffd",
         "Hello world", " Hello world", "Hello world ", "hello   world", "Hello\nworld", "Hello\r\nworld",
         "Hello\tworld", "HELLO WORLD", "I'm here. You're there. It's fine. We'll see. They've gone. He'd go.",
         "I'M HERE. YOU'RE THERE. IT'S FINE.", "don't 'tis 'S 'sup ''s", "can’t won’t it’s",
         "12345678901234567890", "3.14159265358979", "1,000,000", "0x1F 0b1010 1e-9",
         "   leading spaces", "trailing spaces   ", "\n\n\nnewlines\n\n\n", "a\r\rb", "a\r\n\r\nb",
         " \t\n \t\n", "\u00a0non\u00a0breaking", "full\u3000width\u3000space", "zero\u200bwidth",
         "Ａｂｃ１２３", "ﬁ ﬂ ﬀ", "Å Å Å", "한국어", "\u1112\u1161\u11ab", "가\u11a8",
         "ｶﾀｶﾅ", "Ω Ω", "K K", "ẛ̣", "\u0958", "\u2126", "\u00c5", "\u212b", "\u1e9b\u0323",
         "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|begin_of_text|>", "<|eot_id|>", "<s>", "</s>", "<unk>",
         "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n",
         "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
         "<s>[INST] Hello [/INST] Hi</s>", "<s><s></s></s>", "text<s>text</s>text", " <s> ", "<think>\n\n</think>\n\n",
         "<|im_start|><|im_start|><|im_start|>", "<|endoftext|>x<|endoftext|>", "a<|im_end|>b",
         "▁", "▁▁", "▁hello", "_hello", "<0x41>", "<0xFF>", "Ġ", "Ċ", "ĠĠ",
         "👨‍👩‍👧‍👦", "👍🏽", "🏳️‍🌈", "🇺🇳🇫🇷", "\U0010ffff", "\U000e0041", "\ue000", "\x00", "a\x00b", "\x7f",
         "\u202e reversed \u202c", "\ufeffbom", "\u200d", "\ufe0f", "\u0301", "\u0301\u0301\u0301",
         "😀" * 50, "a" * 1000, "ab" * 600, "安" * 800, "1" * 500, " " * 300, "\n" * 200, "\t" * 100,
         "Donaudampfschiffahrtselektrizitätenhauptbetriebswerkbauunterbeamtengesellschaft",
         "pneumonoultramicroscopicsilicovolcanoconiosis" * 20, "x" * 5000, "é" * 2000, "e\u0301" * 300,
         "ـــــــــ", "ﷺ", "ﷲ", "ᄀᄀᄀ", "ꦲꦏ꧀ꦱꦫ", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "𝟘𝟙𝟚", "Ⅰ Ⅱ Ⅲ Ⅳ", "①②③", "⁰¹²³⁴⁵⁶⁷⁸⁹"]
    return [("fixed", t) for t in s]


def generate():
    rng = random.Random(SEED)
    out = list(fixed_strings())
    for _ in range(500):
        out.append(("sentence", " ".join(sentence(rng) for _ in range(rng.randint(1, 4)))))
    for lang in list(WORDS) + list(NO_SPACE):
        for _ in range(20):
            out.append((f"lang_{lang}", pick_words(rng, lang, rng.randint(1, 30))))
    for _ in range(120):
        k = rng.randint(1, 8)
        sep = rng.choice(["", " ", "  "])
        out.append(("emoji", sep.join(rng.choice(EMOJI + [sentence(rng)]) for _ in range(k))))
    for _ in range(100):
        out.append(("combining", " ".join(combining(rng) for _ in range(rng.randint(1, 6)))))
    for _ in range(150):
        parts = [rng.choice(WHITESPACE) * rng.randint(1, 6) if i % 2 == 0 else sentence(rng)
                 for i in range(rng.randint(1, 7))]
        out.append(("whitespace", "".join(parts)))
    for _ in range(150):
        out.append(("number", rng.choice(["", "x", "v", "Total: ", "$", " "]) +
                    " ".join(number(rng) for _ in range(rng.randint(1, 4)))))
    for code in CODE:
        out.append(("code", code))
    for _ in range(100):
        out.append(("code", "".join(rng.choice(CODE) for _ in range(rng.randint(1, 4)))))
    for _ in range(150):
        parts = []
        for _ in range(rng.randint(1, 6)):
            parts.append(rng.choice(SPECIALS + NEAR_SPECIALS) if rng.random() < 0.5 else sentence(rng))
        out.append(("special", rng.choice(["", " ", "\n"]).join(parts)))
    for _ in range(40):
        w = "".join(rng.choice("abcdefghijklmnopqrstuvwxyzéßøЖΩ中ア") for _ in range(rng.randint(200, 3000)))
        out.append(("long_word", w))
    for _ in range(60):
        out.append(("fffd", sentence(rng) + "\ufffd" * rng.randint(1, 3) + sentence(rng)))
    for _ in range(400):
        out.append(("mix", random_mix(rng)))
    for _ in range(200):
        out.append(("random_chars", "".join(random_char(rng) for _ in range(rng.randint(1, 40)))))
    records = [{"tag": tag, "text": text} for tag, text in out]
    for _ in range(120):
        raw = invalid_utf8(rng)
        records.append({"tag": "invalid_utf8", "raw_hex": raw.hex(), "text": raw.decode("utf-8", errors="replace")})
    return records


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    default = os.path.join(here, "..", "tests", "data", "tokenizer", "corpus.jsonl")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=default)
    args = ap.parse_args()
    records = generate()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8", newline="\n") as f:
        for r in records:
            # ensure_ascii=False keeps the file readable; json escapes the ASCII controls, and the
            # Unicode line breaks are escaped too so that no line splitter can cut a record in two.
            line = json.dumps(r, ensure_ascii=False)
            for ch in ("\u0085", "\u2028", "\u2029"):
                line = line.replace(ch, "\\u%04x" % ord(ch))
            f.write(line + "\n")
    size = os.path.getsize(args.out)
    tags = {}
    for r in records:
        tags[r["tag"].split("_")[0]] = tags.get(r["tag"].split("_")[0], 0) + 1
    print(f"wrote {len(records)} strings ({size} bytes) to {args.out}")
    print("by kind: " + ", ".join(f"{k}={v}" for k, v in sorted(tags.items())))


if __name__ == "__main__":
    main()
