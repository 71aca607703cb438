"""How much a faster precision changes the model: greedy top-1 agreement with the fp32
reference on teacher-forced text, and perplexity, both on the same fixed text.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

SAMPLE_TEXT = """\
The history of the printing press begins long before Johannes Gutenberg. In China, woodblock \
printing was used to reproduce texts and images on paper by the ninth century, and movable type \
made of baked clay was described in the eleventh. Gutenberg's contribution, around 1440, was a \
practical system: metal type cast in a hand mould, an oil-based ink that clung to metal, and a \
press adapted from the screw presses used to make wine and olive oil. Within fifty years, \
printing shops had spread to more than two hundred cities across Europe, and millions of books \
had been produced.

To make a simple loaf of bread, mix 500 grams of flour with 10 grams of salt and 7 grams of dry \
yeast. Add 350 millilitres of warm water and knead the dough for about ten minutes, until it is \
smooth and elastic. Cover it and let it rise for an hour, then shape it, let it rise again for \
thirty minutes, and bake it at 220 degrees Celsius for thirty to thirty-five minutes.

def fibonacci(n):
    \"\"\"Return the first n Fibonacci numbers.\"\"\"
    numbers = [0, 1]
    while len(numbers) < n:
        numbers.append(numbers[-1] + numbers[-2])
    return numbers[:n]

Question: What is the capital of France, and why is it famous?
Answer: The capital of France is Paris. It is famous for its art museums such as the Louvre, \
for landmarks like the Eiffel Tower and Notre-Dame, for its cafes and cuisine, and for its \
long role as a centre of fashion, science and politics.

The water cycle describes how water moves between the oceans, the air and the land. Heat from \
the sun evaporates water from seas, lakes and rivers, and plants release water vapour through \
their leaves. As the warm, moist air rises it cools, and the vapour condenses into tiny droplets \
that form clouds. When the droplets merge and grow heavy enough, they fall as rain, snow or hail. \
Some of that water soaks into the ground and feeds springs and wells; the rest runs off into \
streams that carry it back to the sea, where the cycle begins again.

Dear Ms. Patel,

Thank you for your letter of 12 March about the delayed delivery of your order. I am sorry for \
the inconvenience. Our warehouse was closed for two days because of a storm, and several \
shipments left later than planned. Your parcel was sent this morning and should arrive by \
Friday. As an apology, we have refunded the delivery charge to your card. Please let me know if \
there is anything else I can do.

Kind regards,
Tom Baker
Customer Service

A good night's sleep matters for health. Adults need between seven and nine hours a night. To \
sleep better, go to bed and get up at the same time every day, keep the bedroom dark, quiet and \
cool, avoid caffeine in the afternoon, and put screens away an hour before bed. Regular exercise \
helps too, as long as it is not too close to bedtime.

User: Can you explain what a prime number is?
Assistant: A prime number is a whole number greater than 1 whose only divisors are 1 and \
itself. For example, 2, 3, 5, 7, 11 and 13 are prime, while 4, 6, 8 and 9 are not, because they \
can be divided evenly by smaller numbers. There are infinitely many primes, a fact first proved \
by Euclid more than two thousand years ago.
"""


@dataclass(frozen=True)
class Quality:
    """One precision against the fp32 reference on the same tokens."""

    tokens: int
    top1_agreement: float
    """Share of positions whose argmax equals the reference's argmax."""
    perplexity: float
    reference_perplexity: float

    @property
    def perplexity_increase(self) -> float:
        """Relative: 0.01 = 1 % worse than the reference."""
        return self.perplexity / self.reference_perplexity - 1


def compare(ref_logits: torch.Tensor, logits: torch.Tensor, ids: torch.Tensor) -> Quality:
    """ref_logits, logits: [T, V] for input ids [T] (position t predicts ids[t + 1])."""
    targets = ids[1:]
    ref, new = ref_logits[:-1].float(), logits[:-1].float()

    def ppl(lg: torch.Tensor) -> float:
        nll = torch.nn.functional.cross_entropy(lg, targets)
        return math.exp(nll.item())

    agree = (ref.argmax(-1) == new.argmax(-1)).float().mean().item()
    return Quality(len(targets), agree, ppl(new), ppl(ref))


@torch.inference_mode()
def measure(model: Any, tokenizer: Any, runner: Any, text: str = SAMPLE_TEXT) -> Quality:
    """``runner`` (a FastRunner) against ``model``'s fp32 full forward on ``text``."""
    ids = torch.tensor(tokenizer.encode(text), device=runner.device)
    dtype = next(model.parameters()).dtype
    if dtype != torch.float32:
        raise ValueError("the reference model must be float32")
    ref = model(ids[None]).logits[0]  # [T, V]
    logits = runner.fast.forward(runner.new_cache(), ids[None], all_logits=True)[0]
    return compare(ref, logits, ids)
