"""A fixed, varied prompt set for differential exactness tests: chat, code and translation."""

CHAT = [
    "What is the capital of France? Answer in one sentence.",
    "Give me three tips for sleeping better.",
    "Explain what a black hole is to a ten-year-old.",
    "Write a haiku about autumn leaves.",
    "List the planets of the solar system in order.",
    "Why is the sky blue?",
    "Suggest a name for a small coffee shop by the sea.",
]
CODE = [
    "Write a Python function that returns the factorial of n.",
    "Rewrite this function with type hints:\ndef add(a, b):\n    return a + b\n",
    "Rename the variable x to total in this code:\ndef f(items):\n    x = 0\n    for i in items:\n"
    "        x += i\n    return x\n",
    "Write a Python one-liner that reverses a string s.",
    "Fix the bug: def is_even(n):\n    return n % 2 == 1\n",
    "Write a SQL query selecting all users older than 30 from a table users.",
    "Add a docstring to this function:\ndef area(r):\n    return 3.14159 * r * r\n",
]
TRANSLATE = [
    "Translate to German: The cat sits on the mat.",
    "Translate to French: I would like a cup of coffee, please.",
    "Translate to Spanish: Where is the train station?",
    "Translate to German: Tomorrow we will go to the mountains if the weather is good.",
    "Translate to French: The meeting has been moved to Thursday afternoon.",
    "Translate to Chinese: Good morning, how are you?",
]
ALL = CHAT + CODE + TRANSLATE
