"""The in-app guide: every element named in vLLM's vocabulary."""

GUIDE_HTML = """
<h3>Reading the picture</h3>
<p><b>Physical KV-cache pool</b> (centre): the GPU memory a serving engine reserves for
keys and values, cut into fixed-size <b>blocks</b>. Each tile is one physical block; its
number is the <b>block id</b>. The small cells are its <b>slots</b>, one per token
(<i>block size</i> = slots per block); a filled cell holds that token's key and value
vectors for every KV head. Colour = the request that owns the block: a scheduler request's
samples or beams (request/s0, /s1 …, vLLM's sequence group) share its colour, in the pool,
the block tables, the scheduler's chips and the CPU pool alike; a sequence you fork by hand
(A → A2) is a new owner and takes a colour of its own. Past seven owners the colours come
back lighter or darker with a hatch. Grey tiles are in the <b>free queue</b>, waiting to be
allocated. The legend above the pool shows each kind of tile (hover an entry).</p>
<p><b>Ref count</b>: the badge ×2, ×3 … on a tile counts the block tables that hold the
block. Forking a sequence (parallel sampling, beam search, or Fork by hand) shares all its
blocks: no copy, ref counts go up, and the tile shows one band per holder, in each holder's
colour (the samples or beams of one request share its colour, so their bands look alike: the
×N badge counts them, and a tile's tooltip names each holder).</p>
<p><b>Copy-on-write</b>: when a sequence writes a new token into a <i>shared</i>, partly
filled last block, it first gets its own copy (the arrow) and the ref count of the
original drops. Full shared blocks stay shared for ever.</p>
<p><b>Prefix caching</b> (scenarios with <code>prefix_caching = true</code>): a full
block is hashed together with the hash of the block before it, so a hash names a whole
prefix. A new prompt that starts with cached blocks takes them (a green flash) instead
of allocating and computing them — only the block of its last token is always
computed. A freed block keeps its tokens and hash (dashed outline, grey cells) until an
allocation evicts it: free blocks that hold no cached prefix are taken first, and cached
ones only once those run out, least recently used first (as vLLM does); that eviction
flashes red. The hash is SHA-256 with a root that is random for each
run, as vLLM's: an ordinary hash can be made to collide on purpose, and a crafted prompt
would then be served another user's cached prefix (CVE-2025-25183); a hit compares the
tokens too. Two blocks holding the same prefix both stay cached, so evicting one leaves
the prefix reachable through the other.</p>
<p><b>Scheduler</b> (scenarios with <code>submit</code> and <code>schedule</code> steps; the
<b>Scheduler</b> tab shows its queues as lanes of chips, and the memory panel's summary
names them). The scenario's header says which engine: <code>scheduler = "v0"</code>
(vLLM's former engine, the default) or <code>"v1"</code> (its current one).
<i>v0</i>: requests wait in a first-come-first-served queue and are admitted while the free
blocks, less a small <i>watermark</i>, cover their prompt, which is prefilled whole; each
schedule step decodes one token for every running sequence. Here the step that admits a
request writes its prompt's K/V and samples nothing, and the next step samples the first
token and writes its K/V with it (vLLM v0 sampled the first token in the prefill step itself:
the same tokens and blocks, one step earlier; v1 below does it as vLLM does). When a step cannot get a block
the newest request is <b>preempted</b> — by <i>recompute</i> (its blocks are freed and it
returns to the front of the queue, to be prefilled again) or by <i>swap</i> (its blocks go
to a CPU pool, flashing red, and come back bit for bit, flashing green; at rest they keep
their owner's colour). Parallel samples and beams are
forks, preempted together.</p>
<p><i>v1</i>: each step has one <b>token budget</b> (<code>max_num_batched_tokens</code>,
the bar in the Scheduler tab), spent on the running requests first, then on waiting ones.
A prompt longer than what is left is <b>chunked</b>: prefilled a piece per step
(“prefilling 35/37” on its chip), and the step that completes it samples the first token.
Admission credits prefix-cache hits, even on blocks sitting in the free queue. Preemption
is by recompute only, frees the newest running request (maybe the one asking) and admits
nobody that step. n samples are child requests (r/s0, r/s1 …); beam search is not in the
engine. Block 0 is the <b>null block</b>, a placeholder vLLM never hands out: it counts as
used but holds no sequence's slots.</p>
<p><b>Waste vs contiguous</b> replays a workload through paging and through Orca-style
contiguous reservations, on a serving-sized pool of its own (a model shape on a GPU, or a
block count you choose), not on the scenario's. <b>What-if</b> replays the scenario with one setting
changed (block size, pool, token budget, engine …), memory only, a curve per variant over
the scheduler's iterations (a submit is not one), and <b>Latency</b> times it on a model
shape and a GPU (roofline estimates).</p>
<p><b>Prefill and decode</b> (the bar under the narration): a <i>prefill</i> computes a whole
prompt (or several tokens) in one pass, solid; a <i>decode</i> computes one new token per
running sequence, hatched, reading every earlier token's K/V from its blocks; prompt tokens
a prefix-cache hit found in the pool are <i>skipped</i>, dashed and empty. Each row's Tokens
cell says "+N prefill" or "+1 decode" for the step. <b>Beam tree</b> (a tab beside Memory):
a beam search drawn step by step, each kept beam's token and its total log-probability;
live beams coloured, pruned ones faded (the blocks only they held were freed), and the final
texts ranked at the end.</p>
<p><b>Sequences and block tables</b> (left): a sequence's tokens are split into
<b>logical blocks</b> — token <i>t</i> lives in logical block <i>t // block_size</i>, slot
<i>t % block_size</i>. The <b>block table</b> maps each logical block (L0, L1, …) to the
physical block holding it; * marks a shared entry. Physical blocks need not be
contiguous or in order — that is the point of paging. Lines join the selected table's
entries to their tiles; past a handful of entries only the line of the entry being looked
up is drawn (hover a token, or a box of the table).</p>
<p><b>Text</b> (a real model): the token map shows each token's text (· a space, ↵ a
newline), a tile's tooltip the text in its slots, and the <b>Text</b> tab the selected
sequence's prompt and, in bold, what the model wrote — a ▏#n mark where block <i>n</i>
starts, each block's run tinted like its tile (×2: shared). <b>Add</b> asks for a prompt
you type; the model's tokenizer turns it into token ids.</p>
<p><b>Block-table lookup</b>: after every step the paged-attention kernel runs one decode
step for every sequence (query = its newest token). For the selected sequence the
animation lights, in the kernel's real order, each table entry and the physical block
it reads — no gather into a contiguous buffer, an online softmax across blocks.</p>
<p><b>Kernel vs dense</b> (the ✓ badge above the pool opens it; in a window narrower
than 1400 px it folds back to the badge): the kernel's output vector for one head against
dense attention (torch SDPA) recomputed from the same tokens, the per-head max abs error
against the bound that fp32 rounding explains for that head (it grows with the head
dim, the scores' size and the context), and the attention weights over the context
coloured by the physical block each token was read from. The K/V the kernel read for
the selected sequence are also compared bit for bit with what its tokens wrote: one
corrupted slot in a long context moves the average by only about 1/L.</p>
<p><b>Kernel walk-through</b> (a tab beside the kernel panel): the kernel of this step
replayed for the selected sequence and head. Step through it: each token's block-table
lookup (logical block → physical block), its score q·k·scale, the running maximum m and
sum ℓ of the online softmax (a new maximum rescales everything before it by
exp(m_old − m_new)); for the CUDA kernel, which warp and thread group reads each token and
how the groups, then the warps, merge; for v2, each 512-token partition on its own, then a
reduce that weighs partition i by its sum × exp(mᵢ − M). The last stage compares the
replay's output with the kernel's and dense attention's.</p>
<p><b>Memory</b> (bottom): blocks used per step against what reserving
<i>max_model_len</i> contiguously for every sequence would hold; <b>utilisation</b> =
slots holding tokens / slots allocated; <b>internal fragmentation</b> = allocated but
empty slots at the end of last blocks (under one block per sequence with paging). The dots
mark the current step.</p>
<h3>Keys</h3>
<table>
<tr><td>Space</td><td>play / pause</td></tr>
<tr><td>→ / ←</td><td>step forward / back</td></tr>
<tr><td>Home / End</td><td>first / last step</td></tr>
<tr><td>A</td><td>add a sequence (on a real model a dialog asks for its prompt, or submits a request;
on the synthetic model the prompt length comes from the toolbar)</td></tr>
<tr><td>G / Shift+G</td><td>grow the selected sequence by 1 / by N tokens</td></tr>
<tr><td>F</td><td>fork the selected sequence</td></tr>
<tr><td>Delete</td><td>free the selected sequence</td></tr>
<tr><td>S</td><td>one scheduler step for the submitted requests</td></tr>
<tr><td>L</td><td>block-table → pool lines on / off</td></tr>
<tr><td>Ctrl+Z / Ctrl+Shift+Z</td><td>undo / redo your own actions</td></tr>
<tr><td>Ctrl+R</td><td>reload the scenario (start over)</td></tr>
<tr><td>F1</td><td>this guide</td></tr>
<tr><td>Ctrl + / Ctrl − / Ctrl 0</td><td>zoom the pool in / out / fit</td></tr>
</table>
<p>Your own actions branch the timeline at the current step: the scenario's later steps are
set aside (Edit → Undo brings them back), and File → Save scenario keeps what you did.</p>
"""
