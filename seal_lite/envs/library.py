"""The worked example of a user's environment: a small lending library (docs/your-tools.md walks through it).

``data.environment: library`` trains on it (recipes/library.yaml). Everything seal-lite needs is below: one class
whose public methods are the tools (typed, documented), and tasks that say, turn by turn, which calls do what the
user asks. Some turns must be declined: the user leaves out what the call needs, or asks for what no tool does.
"""

from __future__ import annotations

from typing import Literal

from seal_lite.envs.python_tools import ToolEnvironment

BOOKS = {"Dune": {"author": "Frank Herbert", "copies": 2}, "Emma": {"author": "Jane Austen", "copies": 1},
         "Ulysses": {"author": "James Joyce", "copies": 0}, "Beloved": {"author": "Toni Morrison", "copies": 3},
         "Kindred": {"author": "Octavia Butler", "copies": 1}, "Middlemarch": {"author": "George Eliot", "copies": 0}}
MEMBERS = {"M-101": {"name": "Ana", "fine": 0.0}, "M-102": {"name": "Ben", "fine": 2.5},
           "M-103": {"name": "Chen", "fine": 0.0}, "M-104": {"name": "Dara", "fine": 4.0}}
LOANS = {"M-101": {"Emma": 1}, "M-103": {"Ulysses": 2}}


class Library:
    """The city library's lending desk."""

    def __init__(self, books: dict | None = None, members: dict | None = None, loans: dict | None = None,
                 reservations: dict | None = None):
        self.books = books if books is not None else {title: dict(book) for title, book in BOOKS.items()}
        self.members = members if members is not None else {number: dict(m) for number, m in MEMBERS.items()}
        self.loans = loans if loans is not None else {number: dict(held) for number, held in LOANS.items()}
        self.reservations = reservations if reservations is not None else {}

    def search_catalog(self, query: str) -> dict:
        """Find books whose title or author contains the query, with the copies on the shelf.

        Args:
            query: Part of a title or an author's name, in any case.
        """
        found = [{"title": title, "author": book["author"], "copies_available": book["copies"]}
                 for title, book in self.books.items()
                 if query.lower() in title.lower() or query.lower() in book["author"].lower()]
        return {"matches": found}

    def account(self, member_id: str) -> dict:
        """Show a member's loans (weeks left on each), reservations and unpaid fine.

        Args:
            member_id: The member's card number, such as M-101.
        """
        member = self._member(member_id)
        return {"name": member["name"], "fine": member["fine"], "loans": self.loans.get(member_id, {}),
                "reservations": self.reservations.get(member_id, [])}

    def borrow_book(self, member_id: str, title: str) -> dict:
        """Lend a book on the shelf to a member for two weeks. Members with an unpaid fine cannot borrow.

        Args:
            member_id: The member's card number, such as M-101.
            title: The book's exact title.
        """
        member, book = self._member(member_id), self._book(title)
        if member["fine"] > 0:
            raise ValueError(f"{member_id} owes a fine of {member['fine']}; it must be paid first")
        if title in self.loans.get(member_id, {}):
            raise ValueError(f"{member_id} already has {title!r}")
        if book["copies"] == 0:
            raise ValueError(f"no copy of {title!r} is on the shelf; reserve it instead")
        book["copies"] -= 1
        self.loans.setdefault(member_id, {})[title] = 2
        return {"borrowed": title, "weeks": 2}

    def return_book(self, member_id: str, title: str) -> dict:
        """Take back a book a member has on loan.

        Args:
            member_id: The member's card number, such as M-101.
            title: The book's exact title.
        """
        self._member(member_id)
        if title not in self.loans.get(member_id, {}):
            raise ValueError(f"{member_id} has no loan of {title!r}")
        del self.loans[member_id][title]
        self._book(title)["copies"] += 1
        return {"returned": title}

    def renew_loan(self, member_id: str, title: str, weeks: Literal[1, 2] = 1) -> dict:
        """Extend a member's loan, unless another member has reserved the book.

        Args:
            member_id: The member's card number, such as M-101.
            title: The book's exact title.
            weeks: How many more weeks: 1 or 2.
        """
        self._member(member_id)
        if title not in self.loans.get(member_id, {}):
            raise ValueError(f"{member_id} has no loan of {title!r}")
        if any(title in held for other, held in self.reservations.items() if other != member_id):
            raise ValueError(f"{title!r} is reserved by another member and cannot be renewed")
        if weeks not in (1, 2):
            raise ValueError("weeks must be 1 or 2")
        self.loans[member_id][title] += weeks
        return {"renewed": title, "weeks_left": self.loans[member_id][title]}

    def reserve_book(self, member_id: str, title: str) -> dict:
        """Put a member on the waiting list for a book that has no copy on the shelf.

        Args:
            member_id: The member's card number, such as M-101.
            title: The book's exact title.
        """
        self._member(member_id)
        if self._book(title)["copies"] > 0:
            raise ValueError(f"{title!r} is on the shelf; borrow it instead")
        self.reservations.setdefault(member_id, []).append(title)
        return {"reserved": title}

    def pay_fine(self, member_id: str, amount: float) -> dict:
        """Pay all or part of a member's fine.

        Args:
            member_id: The member's card number, such as M-101.
            amount: How much to pay, at most what is owed.
        """
        member = self._member(member_id)
        if not 0 < amount <= member["fine"]:
            raise ValueError(f"amount must be more than 0 and at most the fine owed ({member['fine']})")
        member["fine"] = round(member["fine"] - amount, 2)
        return {"paid": amount, "fine_left": member["fine"]}

    def _member(self, member_id: str) -> dict:
        if member_id not in self.members:
            raise ValueError(f"no member {member_id!r}; card numbers look like M-101")
        return self.members[member_id]

    def _book(self, title: str) -> dict:
        if title not in self.books:
            raise ValueError(f"the library has no book titled {title!r}")
        return self.books[title]


def task(task_id: str, *turns: tuple[str, list[str]], split: str = "train", **state) -> dict:
    """A task from (user message, expected calls) pairs; ``state``: what differs from the default library."""
    return {"id": task_id, "turns": [text for text, _ in turns], "calls": [calls for _, calls in turns],
            "state": state, "split": split}


TASKS = [
    task("library_0", ("Please lend 'Dune' to member M-103.", ["borrow_book(member_id='M-103', title='Dune')"]),
         ("She's done with 'Ulysses' too; take it back.", ["return_book(member_id='M-103', title='Ulysses')"])),
    task("library_1", ("What do you have by Jane Austen?", ["search_catalog(query='Jane Austen')"]),
         ("Member M-101 wants two more weeks with 'Emma'.",
          ["renew_loan(member_id='M-101', title='Emma', weeks=2)"])),
    task("library_2", ("I'd like to borrow a book, please.", []),
         ("It's 'Beloved', and my card is M-101.", ["borrow_book(member_id='M-101', title='Beloved')"])),
    task("library_3", ("Member M-102 would like to pay off the 2.5 fine.", ["pay_fine(member_id='M-102', amount=2.5)"]),
         ("Now lend him 'Kindred'.", ["borrow_book(member_id='M-102', title='Kindred')"])),
    task("library_4", ("Put M-101 on the waiting list for 'Ulysses'.",
                       ["reserve_book(member_id='M-101', title='Ulysses')"]),
         ("Can you order a second copy of 'Ulysses' from the publisher?", [])),
    task("library_5", ("What does member M-103 have out right now?", ["account(member_id='M-103')"]),
         ("Renew that book for one week.", ["renew_loan(member_id='M-103', title='Beloved', weeks=1)"]),
         loans={"M-103": {"Beloved": 1}}),
    task("library_6", ("Return 'Emma' for member M-101.", ["return_book(member_id='M-101', title='Emma')"]),
         ("And lend it straight to M-103.", ["borrow_book(member_id='M-103', title='Emma')"])),
    task("library_7", ("Is there anything by Octavia Butler?", ["search_catalog(query='Octavia Butler')"]),
         ("Lend it to M-101.", ["borrow_book(member_id='M-101', title='Kindred')"])),
    task("library_8", ("Please renew my loan.", []),
         ("My card is M-101 and the book is 'Emma'; one week is enough.",
          ["renew_loan(member_id='M-101', title='Emma', weeks=1)"])),
    task("library_9", ("Member M-104 pays 4.0 to clear the fine.", ["pay_fine(member_id='M-104', amount=4.0)"]),
         ("Then she borrows 'Beloved'.", ["borrow_book(member_id='M-104', title='Beloved')"]),
         ("Show her account afterwards.", ["account(member_id='M-104')"])),
    task("library_10", ("Reserve 'Middlemarch' for M-103.", ["reserve_book(member_id='M-103', title='Middlemarch')"]),
         ("Delete member M-102 from the system, please.", [])),
    task("library_11", ("Search the catalog for 'Dune'.", ["search_catalog(query='Dune')"]),
         ("Lend one copy to M-101 and one to M-103.", ["borrow_book(member_id='M-101', title='Dune')",
                                                       "borrow_book(member_id='M-103', title='Dune')"])),
    task("library_12", ("M-102 pays 1.0 of the fine today.", ["pay_fine(member_id='M-102', amount=1.0)"]),
         ("How much does he still owe?", ["account(member_id='M-102')"])),
    task("library_13", ("Take back 'Ulysses' from M-103.", ["return_book(member_id='M-103', title='Ulysses')"]),
         ("Lend 'Ulysses' to M-101 now that it is back.", ["borrow_book(member_id='M-101', title='Ulysses')"])),
    task("library_14", ("Lend 'Emma' to member M-103.", ["borrow_book(member_id='M-103', title='Emma')"]),
         ("Waive the rest of M-104's fine.", [])),
    task("library_15", ("Please reserve a book for me.", []),
         ("'Middlemarch', card M-101.", ["reserve_book(member_id='M-101', title='Middlemarch')"])),
    task("library_16", ("Which books by George Eliot do you hold?", ["search_catalog(query='George Eliot')"]),
         ("Put member M-102 on its waiting list.", ["reserve_book(member_id='M-102', title='Middlemarch')"])),
    task("library_17", ("Renew 'Ulysses' for M-103 by two weeks.",
                        ["renew_loan(member_id='M-103', title='Ulysses', weeks=2)"]),
         ("Also lend M-103 'Beloved'.", ["borrow_book(member_id='M-103', title='Beloved')"])),
    task("library_18", ("Show member M-101's account.", ["account(member_id='M-101')"]),
         ("Return the book on it.", ["return_book(member_id='M-101', title='Emma')"]),
         ("What time does the library close today?", [])),
    task("library_19", ("Lend 'Kindred' to M-103.", ["borrow_book(member_id='M-103', title='Kindred')"]),
         ("Lend 'Dune' to M-103 as well.", ["borrow_book(member_id='M-103', title='Dune')"])),
    task("library_20", ("M-104 pays 1.5 toward her fine.", ["pay_fine(member_id='M-104', amount=1.5)"]),
         ("And another 2.5 to clear it.", ["pay_fine(member_id='M-104', amount=2.5)"]),
         ("Now lend her 'Dune'.", ["borrow_book(member_id='M-104', title='Dune')"])),
    task("library_21", ("Search for books by Toni Morrison.", ["search_catalog(query='Toni Morrison')"]),
         ("Reserve it for M-101.", [])),  # on the shelf: reserving fails, and borrowing was not asked for
    task("library_30", ("Member M-104 pays her whole 4.0 fine, then borrows 'Dune'.",
                        ["pay_fine(member_id='M-104', amount=4.0)", "borrow_book(member_id='M-104', title='Dune')"]),
         ("Show her account.", ["account(member_id='M-104')"])),
    task("library_22", ("Lend 'Beloved' to member M-101.", ["borrow_book(member_id='M-101', title='Beloved')"]),
         ("Renew it by one week.", ["renew_loan(member_id='M-101', title='Beloved', weeks=1)"]), split="eval"),
    task("library_23", ("What do you have by Frank Herbert?", ["search_catalog(query='Frank Herbert')"]),
         ("Lend it to M-103.", ["borrow_book(member_id='M-103', title='Dune')"]), split="eval"),
    task("library_24", ("I want to return a book.", []),
         ("Card M-103, the book is 'Ulysses'.", ["return_book(member_id='M-103', title='Ulysses')"]), split="eval"),
    task("library_25", ("Member M-102 pays the full 2.5 fine.", ["pay_fine(member_id='M-102', amount=2.5)"]),
         ("Then lend him 'Emma'.", ["borrow_book(member_id='M-102', title='Emma')"]), split="eval"),
    task("library_26", ("Reserve 'Ulysses' for member M-102.", ["reserve_book(member_id='M-102', title='Ulysses')"]),
         ("Print a library card for M-102.", []), split="eval"),
    task("library_27", ("Show M-104's account.", ["account(member_id='M-104')"]),
         ("She pays 4.0.", ["pay_fine(member_id='M-104', amount=4.0)"]), split="eval"),
    task("library_28", ("Lend 'Kindred' to M-101.", ["borrow_book(member_id='M-101', title='Kindred')"]),
         ("Give back 'Emma' for her as well.", ["return_book(member_id='M-101', title='Emma')"]), split="eval"),
    task("library_29", ("Renew 'Emma' for M-101 by two weeks.",
                        ["renew_loan(member_id='M-101', title='Emma', weeks=2)"]),
         ("Lend her 'Dune' too.", ["borrow_book(member_id='M-101', title='Dune')"]), split="eval"),
]

environment = ToolEnvironment("library", Library, TASKS)
