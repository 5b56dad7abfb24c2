//! Shell patterns as the original matched `Conflicts=` and `Replaces=` values: `*` and `?`
//! (never across `/`), `[...]` classes with `^` negation and ranges, and `\` escapes.
//! A malformed pattern matches nothing.

#[derive(Clone, Debug, PartialEq, Eq)]
enum Token {
    Literal(char),
    AnyOne,
    AnyRun,
    Class { negated: bool, ranges: Vec<(char, char)> },
}

/// A compiled pattern.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Glob {
    tokens: Vec<Token>,
}

impl Glob {
    /// Compiles `pattern`; `None` when it is malformed.
    pub fn new(pattern: &str) -> Option<Self> {
        let mut tokens = Vec::new();
        let mut chars = pattern.chars().peekable();
        while let Some(c) = chars.next() {
            tokens.push(match c {
                '*' => Token::AnyRun,
                '?' => Token::AnyOne,
                '\\' => Token::Literal(chars.next()?),
                '[' => {
                    let negated = chars.next_if_eq(&'^').is_some();
                    let mut ranges = Vec::new();
                    loop {
                        let low = match chars.next()? {
                            ']' if !ranges.is_empty() => break,
                            ']' | '-' => return None,
                            '\\' => chars.next()?,
                            c => c,
                        };
                        let high = if chars.next_if_eq(&'-').is_some() {
                            match chars.next()? {
                                ']' | '-' => return None,
                                '\\' => chars.next()?,
                                c => c,
                            }
                        } else {
                            low
                        };
                        ranges.push((low, high));
                    }
                    Token::Class { negated, ranges }
                }
                c => Token::Literal(c),
            });
        }
        Some(Self { tokens })
    }

    pub fn matches(&self, name: &str) -> bool {
        let name: Vec<char> = name.chars().collect();
        match_from(&self.tokens, &name)
    }

    /// The one name the pattern matches, when it has no wildcard.
    pub fn literal(&self) -> Option<String> {
        self.tokens
            .iter()
            .map(|token| match token {
                Token::Literal(c) => Some(*c),
                _ => None,
            })
            .collect()
    }
}

fn match_one(token: &Token, c: char) -> bool {
    match token {
        Token::Literal(literal) => *literal == c,
        Token::AnyOne => c != '/',
        Token::AnyRun => unreachable!("runs are matched by match_from"),
        Token::Class { negated, ranges } => {
            c != '/' && ranges.iter().any(|(low, high)| (*low..=*high).contains(&c)) != *negated
        }
    }
}

/// Iterative matching with one backtrack point per `*`, linear in practice.
fn match_from(tokens: &[Token], name: &[char]) -> bool {
    let (mut t, mut n) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while n < name.len() {
        match tokens.get(t) {
            Some(Token::AnyRun) => {
                star = Some((t, n));
                t += 1;
            }
            Some(token) if match_one(token, name[n]) => {
                t += 1;
                n += 1;
            }
            _ => match star {
                Some((star_t, star_n)) if name[star_n] != '/' => {
                    star = Some((star_t, star_n + 1));
                    t = star_t + 1;
                    n = star_n + 1;
                }
                _ => return false,
            },
        }
    }
    tokens[t..].iter().all(|token| *token == Token::AnyRun)
}

/// Compiles and matches in one step; a malformed pattern matches nothing.
pub fn glob_matches(pattern: &str, name: &str) -> bool {
    Glob::new(pattern).is_some_and(|glob| glob.matches(name))
}

#[cfg(test)]
mod tests {
    use super::glob_matches;

    #[test]
    fn matches_like_path_match() {
        let cases = [
            ("abc", "abc", true),
            ("*", "abc", true),
            ("*c", "abc", true),
            ("a*", "a", true),
            ("a*", "ab/c", false),
            ("a*/b", "abc/b", true),
            ("a*b*c*d*e*/f", "axbxcxdxe/f", true),
            ("a*b*c*d*e*/f", "axbxcxdxexxx/f", true),
            ("a*b*c*d*e*/f", "axbxcxdxe/xxx/f", false),
            ("a*b?c*x", "abxbbxdbxebxczzx", true),
            ("a*b?c*x", "abxbbxdbxebxczzy", false),
            ("ab[c]", "abc", true),
            ("ab[b-d]", "abc", true),
            ("ab[e-g]", "abc", false),
            ("ab[^c]", "abc", false),
            ("ab[^b-d]", "abe", true),
            ("a\\*b", "a*b", true),
            ("a\\*b", "ab", false),
            ("a?b", "a/b", false),
            ("[", "a", false),
            ("[^", "a", false),
            ("a[", "a", false),
            ("[]a]", "]", false),
            ("[-]", "-", false),
            ("conflict.*.service", "conflict.1.service", true),
            ("web@*.service", "web@8080.service", true),
            ("web@*.service", "db.service", false),
        ];
        for (pattern, name, expected) in cases {
            assert_eq!(glob_matches(pattern, name), expected, "{pattern} ~ {name}");
        }
    }
}
