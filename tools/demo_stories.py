#!/usr/bin/env python3
"""The short-story grammar the demo model is trained on (tools/train_demo_model.py), and, run as a
script, N stories of a seed, one a line: the calibration and held-out text of the INT4 quality table
(docs/quantization.md). Training uses seed 0 with 60000 stories; the table uses other seeds.

    python3 tools/demo_stories.py --seed 1 --count 200 > calibration.txt
"""
import argparse
import random

NAMES = ["Tom", "Mia", "Sam", "Lily", "Ben", "Anna", "Max", "Zoe", "Leo", "Ella"]
ANIMALS = ["cat", "dog", "fox", "bird", "rabbit", "bear", "duck", "horse", "mouse", "owl"]
COLORS = ["red", "blue", "green", "yellow", "little", "big", "happy", "brown", "white", "old"]
THINGS = ["ball", "kite", "boat", "book", "hat", "cake", "box", "drum", "map", "lamp"]
PLACES = ["the park", "the forest", "the garden", "the river", "the hill", "the town", "the beach", "the farm"]
FEELINGS = ["happy", "sad", "tired", "brave", "curious", "hungry", "excited", "calm"]
VERBS_PAST = ["found", "lost", "made", "saw", "wanted", "painted", "carried", "shared"]
WEATHER = ["sunny", "rainy", "windy", "cold", "warm", "quiet"]


def sentence(rng, who, pet):
    thing = f"{rng.choice(COLORS)} {rng.choice(THINGS)}"
    forms = [
        f"{who} had a {thing}.",
        f"{who} {rng.choice(VERBS_PAST)} a {thing} in {rng.choice(PLACES)}.",
        f"The {pet} went to {rng.choice(PLACES)} with {who}.",
        f"It was a {rng.choice(WEATHER)} day.",
        f"{who} felt {rng.choice(FEELINGS)}.",
        f"The {pet} was very {rng.choice(FEELINGS)}.",
        f"They played with the {thing} all day.",
        f"{who} said, \"I like my {rng.choice(THINGS)}!\"",
        f"The {pet} ran to {rng.choice(PLACES)} and came back.",
        f"{who} and the {pet} ate a {rng.choice(COLORS)} cake.",
    ]
    return rng.choice(forms)


def story(rng):
    who, pet = rng.choice(NAMES), rng.choice(ANIMALS)
    opening = rng.choice([f"Once upon a time, there was a {rng.choice(COLORS)} {pet}.",
                          f"One day, {who} went to {rng.choice(PLACES)}.",
                          f"{who} had a {rng.choice(COLORS)} {pet}."])
    body = [sentence(rng, who, pet) for _ in range(rng.randint(2, 5))]
    ending = rng.choice(["The end.", f"{who} was happy.", f"The {pet} went to sleep.", "They were friends."])
    return " ".join([opening] + body + [ending])


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--count", type=int, required=True)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    for _ in range(a.count):
        print(story(rng))
